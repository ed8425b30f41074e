//! Regional brokers bridged to a central one, as shipped: a central
//! mosquitto and one per region on free loopback ports, each running the
//! configuration in `packaging/mosquitto/` (`central.conf`, and
//! `regional.conf` with its placeholders filled in), so a test of these
//! proves the shipped files. Only the listener, anonymous access, the
//! persistence folder, `user root` and a 1 s `sys_interval` are the
//! harness's own.
//!
//! A region's bridge can be cut (its broker restarted, same port and
//! persistence, without the bridge section) and restored; the central can
//! be stopped and restarted with [`Process::stop`] / [`Process::restart`].

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::{Process, free_port, spawn, wait_ready};

/// The shipped configurations' folder.
#[must_use]
pub fn packaging_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/mosquitto")
}

/// `regional.conf`'s text with its three placeholders filled in. Pure.
#[must_use]
pub fn render_regional(template: &str, region: &str, prefix: &str, central: &str) -> String {
    template
        .replace("@REGION@", region)
        .replace("@PREFIX@", prefix)
        .replace("@CENTRAL@", central)
}

/// The MQTT client id a region's bridge has on the central broker (as
/// `regional.conf` sets it).
#[must_use]
pub fn bridge_client_id(region: &str) -> String {
    format!("edgeform-bridge-{region}")
}

/// One regional broker.
pub struct Region {
    pub name: String,
    pub broker: Process,
    /// Its configuration file (rewritten to cut or restore the bridge).
    conf: PathBuf,
    /// The harness's own lines (listener, persistence folder).
    head: String,
    /// The shipped `regional.conf`, rendered.
    bridge: String,
}

/// A central broker and its regions.
pub struct Bridged {
    pub central: Process,
    pub regions: Vec<Region>,
    pub prefix: String,
}

/// The harness's own lines in front of a shipped file: a loopback
/// listener on `port`, anonymous access, persistence in `dir`, `$SYS`
/// every second, a log on stderr (the process's log: connections and
/// subscriptions, which a failing test shows). `user root`: run as root, mosquitto would otherwise
/// switch to the `mosquitto` user, which cannot write its database into
/// the test's folder (sessions would not survive a restart); not root,
/// the line is ignored.
fn head(port: u16, dir: &Path) -> String {
    format!(
        "per_listener_settings false\nlistener {port} 127.0.0.1\nallow_anonymous true\n\
         persistence_location {}/\nsys_interval 1\nuser root\n\
         log_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n\
         log_type information\nlog_type subscribe\nlog_timestamp_format %H:%M:%S\n",
        dir.display()
    )
}

/// Start mosquitto with the configuration `text(port, dir)` on a free port
/// (retrying on another one), up when it accepts connections.
fn start(mut text: impl FnMut(u16, &Path) -> String) -> (Process, PathBuf) {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let log = dir.path().join("mosquitto.log");
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(&conf, text(port, dir.path())).expect("write conf");
        let args = vec!["-c".to_owned(), conf.display().to_string()];
        let child = spawn("mosquitto", &args, dir.path(), &log).expect("spawn mosquitto");
        let mut p = Process {
            child: Some(child),
            port,
            dir,
            log,
            binary: "mosquitto".into(),
            args,
            addr: std::net::Ipv4Addr::LOCALHOST,
        };
        if wait_ready(&mut p, |port| {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) {
            return (p, conf);
        }
        last = p.log();
    }
    panic!("mosquitto did not start:\n{last}");
}

/// Start a central broker and one regional broker per name of `regions`
/// (topic prefix `prefix`), and wait until every bridge is connected.
///
/// # Panics
/// When the shipped files cannot be read, a placeholder is left, a broker
/// does not start or a bridge does not connect within 15 s.
#[must_use]
pub fn start_bridged(regions: &[&str], prefix: &str) -> Bridged {
    let dir = packaging_dir();
    let central_text = std::fs::read_to_string(dir.join("central.conf"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("central.conf").display()));
    let template = std::fs::read_to_string(dir.join("regional.conf"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join("regional.conf").display()));
    // The shipped central file sets its own `sys_interval`: the harness's
    // comes after it.
    let (central, _) =
        start(|port, d| format!("{}{central_text}\nsys_interval 1\n", head(port, d)));
    let mut out = Vec::new();
    for name in regions {
        let bridge = render_regional(
            &template,
            name,
            prefix,
            &format!("127.0.0.1:{}", central.port),
        );
        assert!(
            !bridge.contains('@'),
            "a placeholder is left in regional.conf:\n{bridge}"
        );
        let mut heads = String::new();
        let (broker, conf) = start(|port, d| {
            heads = head(port, d);
            format!("{heads}{bridge}")
        });
        out.push(Region {
            name: (*name).to_owned(),
            broker,
            conf,
            head: heads,
            bridge,
        });
    }
    let b = Bridged {
        central,
        regions: out,
        prefix: prefix.to_owned(),
    };
    for r in regions {
        b.wait_bridge(r, true);
    }
    b
}

impl Bridged {
    /// The regional broker of `name`.
    ///
    /// # Panics
    /// When there is no such region.
    #[must_use]
    pub fn region(&self, name: &str) -> &Process {
        &self.region_entry(name).broker
    }

    fn region_entry(&self, name: &str) -> &Region {
        self.regions
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no region {name}"))
    }

    fn region_mut(&mut self, name: &str) -> &mut Region {
        self.regions
            .iter_mut()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no region {name}"))
    }

    /// Cut `name`'s bridge: its broker restarted (SIGTERM, same port and
    /// persistence: its agents reconnect) with the shipped file up to its
    /// bridge section (from the `connection` line on, left out).
    ///
    /// # Panics
    /// When it does not come back.
    pub fn cut(&mut self, name: &str) {
        let r = self.region_mut(name);
        // Everything the shipped file sets before its bridge section.
        let own = r
            .bridge
            .split_once("\nconnection ")
            .map_or(r.bridge.as_str(), |(before, _)| before);
        std::fs::write(&r.conf, format!("{}{own}\n", r.head)).expect("write conf");
        r.broker.restart();
    }

    /// Restore `name`'s bridge (its broker restarted with the shipped
    /// bridge section again) and wait until it is connected.
    ///
    /// # Panics
    /// When it does not come back or the bridge does not connect.
    pub fn restore(&mut self, name: &str) {
        let r = self.region_mut(name);
        std::fs::write(&r.conf, format!("{}{}", r.head, r.bridge)).expect("write conf");
        r.broker.restart();
        self.wait_bridge(name, true);
    }

    /// Whether the central broker holds `up` as `name`'s bridge state
    /// (the bridge's retained notification, `1` up, `0` its last will).
    #[must_use]
    pub fn bridge_up(&self, name: &str) -> Option<bool> {
        let topic = format!("$SYS/broker/connection/{}/state", bridge_client_id(name));
        retained(self.central.port, &topic, Duration::from_millis(500))
            .map(|v| v.as_slice() == b"1")
    }

    /// Wait (15 s at most) until `name`'s bridge is connected (`up`) or
    /// not, as the central broker sees it.
    ///
    /// # Panics
    /// When it does not get there (both brokers' logs are shown).
    pub fn wait_bridge(&self, name: &str, up: bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.bridge_up(name) != Some(up) {
            assert!(
                Instant::now() < deadline,
                "bridge {name} never {}:\ncentral:\n{}\n{name}:\n{}",
                if up { "connected" } else { "went down" },
                self.central.log(),
                self.region_entry(name).broker.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// An MQTT client of its own (clean session) to the broker on
/// 127.0.0.1:`port`, taking packets as large as a summary may be.
fn client(port: u16) -> (rumqttc::Client, rumqttc::Connection) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut o = rumqttc::MqttOptions::new(
        format!("harness-{}-{n}", std::process::id()),
        "127.0.0.1",
        port,
    );
    o.set_keep_alive(Duration::from_secs(10));
    o.set_max_packet_size(16 << 20, 16 << 20);
    rumqttc::Client::new(o, 16)
}

/// The first event `want` picks out of `connection` before `deadline`;
/// `None` at the deadline or on a connection error.
fn first<T>(
    connection: &mut rumqttc::Connection,
    deadline: Instant,
    mut want: impl FnMut(rumqttc::Packet) -> Option<T>,
) -> Option<T> {
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match connection.recv_timeout(left) {
            Ok(Ok(rumqttc::Event::Incoming(p))) => {
                if let Some(t) = want(p) {
                    return Some(t);
                }
            }
            Ok(Ok(rumqttc::Event::Outgoing(_))) => {}
            Ok(Err(_)) | Err(_) => return None,
        }
    }
}

/// The topics of the messages published on `filters` at one broker,
/// from [`watch`]'s return (its SUBACK) until [`Watch::topics`].
pub struct Watch {
    client: rumqttc::Client,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Vec<String>>,
}

/// Watch `filters` (QoS 1) at the broker on 127.0.0.1:`port`.
///
/// # Panics
/// When the broker does not confirm the subscription within 10 s.
#[must_use]
pub fn watch(port: u16, filters: &[&str]) -> Watch {
    let (client, mut connection) = client(port);
    for f in filters {
        client.subscribe(*f, rumqttc::QoS::AtLeastOnce).unwrap();
    }
    let mut acked = 0;
    first(
        &mut connection,
        Instant::now() + Duration::from_secs(10),
        |p| {
            acked += usize::from(matches!(p, rumqttc::Packet::SubAck(_)));
            (acked == filters.len()).then_some(())
        },
    )
    .unwrap_or_else(|| panic!("the broker on {port} did not confirm {filters:?}"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut topics = Vec::new();
        while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
            match connection.recv_timeout(Duration::from_millis(100)) {
                Ok(Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p)))) => {
                    topics.push(p.topic);
                }
                Ok(Ok(_)) | Err(_) => {}
                // The broker went away: what was seen is all there is.
                Ok(Err(_)) => break,
            }
        }
        topics
    });
    Watch {
        client,
        stop,
        thread,
    }
}

impl Watch {
    /// Every topic seen so far, in order of arrival (up to the broker's
    /// going away, if it did).
    #[must_use]
    pub fn topics(self) -> Vec<String> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let topics = self.thread.join().unwrap();
        let _ = self.client.disconnect();
        topics
    }
}

/// Publish `payload` on `topic`, retained, QoS 1, to the broker on
/// 127.0.0.1:`port`: whether the broker acknowledged it (within 2 s).
#[must_use]
pub fn publish_retained(port: u16, topic: &str, payload: &[u8]) -> bool {
    let (client, mut connection) = client(port);
    if client
        .publish(topic, rumqttc::QoS::AtLeastOnce, true, payload.to_vec())
        .is_err()
    {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let acked = first(&mut connection, deadline, |p| {
        matches!(p, rumqttc::Packet::PubAck(_)).then_some(())
    })
    .is_some();
    let _ = client.disconnect();
    acked
}

/// The retained message on `topic` at the broker on 127.0.0.1:`port`
/// (`$SYS` included): `None` when there is none within `wait`, or the
/// broker does not answer.
#[must_use]
pub fn retained(port: u16, topic: &str, wait: Duration) -> Option<Vec<u8>> {
    let (client, mut connection) = client(port);
    client.subscribe(topic, rumqttc::QoS::AtMostOnce).ok()?;
    let got = first(&mut connection, Instant::now() + wait, |p| match p {
        rumqttc::Packet::Publish(m) if m.retain && m.topic == topic => Some(m.payload.to_vec()),
        _ => None,
    });
    let _ = client.disconnect();
    got
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_regional_file_has_only_the_three_placeholders() {
        let text = std::fs::read_to_string(packaging_dir().join("regional.conf")).unwrap();
        let rendered = render_regional(&text, "eu", "edgeform", "central.example.net:8883");
        assert!(!rendered.contains('@'), "{rendered}");
        for line in [
            "connection edgeform-eu",
            "address central.example.net:8883",
            "remote_clientid edgeform-bridge-eu",
            "try_private true",
            "cleansession false",
            "topic # in 1 edgeform/cmd/ edgeform/region/eu/cmd/",
            "topic edgeform/result/# out 1",
            "topic edgeform/status/# out 1",
            "topic edgeform/health/# out 0",
            "topic edgeform/sites/# out 0",
            "topic edgeform/summary/# both 1",
            "topic edgeform/summary-lock/# both 1",
        ] {
            assert!(rendered.lines().any(|l| l == line), "{line}:\n{rendered}");
        }
        // Nothing else crosses: every active `topic` line is one of those.
        let topics = rendered.lines().filter(|l| l.starts_with("topic ")).count();
        assert_eq!(topics, 7, "{rendered}");
    }
}
