//! Reaching the MQTT broker, the same way for the agent and the compiler's
//! `status` and `exec`: a `mqtt://` or `mqtts://` URL, a username, a
//! password read only from the environment variable the configuration
//! names (never from a file in git), and for TLS an optional CA file.

use std::time::Duration;

use anyhow::{Context, bail};
use rumqttc::{MqttOptions, TlsConfiguration, Transport};

pub use edgestate::target::Broker;

/// The host, port and whether TLS is used, from a broker URL
/// ([`edgestate::target::parse_broker_url`]).
///
/// # Errors
/// Not a URL, another scheme, credentials or a path in the URL.
pub fn parse_url(text: &str) -> anyhow::Result<(String, u16, bool)> {
    Ok(edgestate::target::parse_broker_url(text)?)
}

/// MQTT 3.1.1 options for `client_id`: persistent session when
/// `persistent` (QoS 1 messages sent while offline arrive on reconnect),
/// credentials and TLS as configured. The caller adds its last will.
///
/// # Errors
/// A bad URL, a password variable that is not set, an unreadable CA file.
pub fn options(broker: &Broker, client_id: &str, persistent: bool) -> anyhow::Result<MqttOptions> {
    let (host, port, tls) = parse_url(&broker.url)?;
    let mut o = MqttOptions::new(client_id, host, port);
    o.set_keep_alive(Duration::from_secs(10));
    o.set_clean_session(!persistent);
    // What the agent's own connection takes: a report or a summary the
    // broker passed never ends this connection either.
    o.set_max_packet_size(
        edgestate::mqtt::MAX_PACKET_BYTES,
        edgestate::mqtt::MAX_PACKET_BYTES,
    );
    let password = match &broker.password_env {
        None => None,
        Some(var) => Some(std::env::var(var).with_context(|| {
            format!("the MQTT password variable `{var}` is not set in the environment")
        })?),
    };
    match (&broker.username, password) {
        (Some(u), p) => {
            o.set_credentials(u.clone(), p.unwrap_or_default());
        }
        (None, Some(_)) => bail!("an MQTT password is configured without a `username`"),
        (None, None) => {}
    }
    if tls {
        let transport = match &broker.ca_file {
            None => Transport::tls_with_config(TlsConfiguration::Native),
            Some(path) => {
                let ca = std::fs::read(path)
                    .with_context(|| format!("reading the MQTT CA file {}", path.display()))?;
                Transport::tls_with_config(TlsConfiguration::SimpleNative {
                    ca,
                    client_auth: None,
                })
            }
        };
        o.set_transport(transport);
    } else if broker.ca_file.is_some() {
        bail!(
            "a CA file is configured but `{}` is not mqtts://",
            broker.url
        );
    }
    Ok(o)
}

/// A one-line description of a connection error, for logs.
#[must_use]
pub fn describe(e: &rumqttc::ConnectionError) -> String {
    match e {
        rumqttc::ConnectionError::ConnectionRefused(code) => {
            format!("the broker refused the connection ({code:?})")
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1884").unwrap(),
            ("127.0.0.1".into(), 1884, false)
        );
        assert_eq!(
            parse_url("mqtts://broker.example").unwrap(),
            ("broker.example".into(), 8883, true)
        );
        assert_eq!(
            parse_url("mqtt://[::1]").unwrap(),
            ("::1".into(), 1883, false)
        );
        for bad in [
            "http://x",
            "mqtt://u:p@x",
            "mqtt://x/topic",
            "nonsense",
            "mqtt://",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn options_need_the_password_variable() {
        let b = Broker {
            url: "mqtt://127.0.0.1".into(),
            username: Some("agent".into()),
            password_env: Some("EDGEMQTT_TEST_SURELY_UNSET".into()),
            ca_file: None,
        };
        let e = options(&b, "c", true).unwrap_err();
        assert!(e.to_string().contains("EDGEMQTT_TEST_SURELY_UNSET"), "{e}");
        let b = Broker {
            password_env: None,
            ..b
        };
        let o = options(&b, "c", true).unwrap();
        assert!(!o.clean_session());
        let b = Broker {
            ca_file: Some("/nonexistent".into()),
            ..b
        };
        assert!(options(&b, "c", true).is_err(), "CA with plain mqtt");
    }
}
