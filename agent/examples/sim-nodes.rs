//! Simulated cluster for the MQTT benchmark: N nodes publishing retained
//! health reports and `online` statuses to a broker, and (optionally) a
//! routing table naming them written to the agent's Redis.
//!
//! ```text
//! sim-nodes --broker 127.0.0.1:1883 --nodes 300 --interval-ms 5000 --seconds 60 \
//!           [--redis redis://127.0.0.1:6379] [--burst 100]
//! ```
//! With `--burst K`, every node publishes K reports back to back (as fast
//! as the broker takes them) instead of one per interval, then exits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use edgestate::routing::{GeoSettings, Node, RoutingTable, Zone};
use rumqttc::{AsyncClient, MqttOptions, QoS};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn report(node: &str, i: usize, seq: u64) -> Vec<u8> {
    let ts = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    serde_json::to_vec(&serde_json::json!({
        "node": node, "ts": ts, "interval_ms": 5000,
        "play_sessions": (i as u64 * 7 + seq) % 500, "out_kbit": 1000 + i as u64,
        "streams": [format!("cam{}", i % 20), format!("cam{}", (i + 1) % 20)],
        "config": {"commit": "sim", "generation": 1},
        "purge": {"queue": 0, "processing": 0},
        "redis": {"ok": true, "role": "master"}, "version": "sim",
    }))
    .unwrap_or_default()
}

fn table(n: usize) -> RoutingTable {
    let mut zones = BTreeMap::new();
    for z in 0..10 {
        zones.insert(
            format!("z{z}"),
            Zone {
                routes: if z == 0 {
                    vec!["0.0.0.0/0".into(), "::/0".into()]
                } else {
                    vec![format!("10.{z}.0.0/16")]
                },
                fallback: (z > 0).then(|| "z0".into()),
            },
        );
    }
    let nodes = (0..n)
        .map(|i| {
            (
                format!("sim-{i}"),
                Node {
                    roles: vec![if i % 3 == 0 { "ingest" } else { "edge" }.into()],
                    region: "eu".into(),
                    zone: Some(format!("z{}", i % 10)),
                    public_url: Some(format!("https://sim-{i}.example.net")),
                    location: None,
                    addresses: vec![format!("198.51.100.{}", i % 250)],
                    playback_session_limit: Some(400),
                    playback_bandwidth_kbit: None,
                    network_bandwidth_kbit: None,
                    drain: false,
                },
            )
        })
        .collect();
    RoutingTable {
        format: edgestate::FORMAT_VERSION,
        cluster: "sim".into(),
        trusted_proxies: vec![],
        geo: GeoSettings::default(),
        zones,
        nodes,
        router_pool: None,
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let broker = arg(&args, "--broker").unwrap_or_else(|| "127.0.0.1:1883".into());
    let (host, port) = broker
        .rsplit_once(':')
        .ok_or_else(|| anyhow::anyhow!("--broker HOST:PORT"))?;
    let n: usize = arg(&args, "--nodes").map_or(Ok(300), |v| v.parse())?;
    let interval =
        Duration::from_millis(arg(&args, "--interval-ms").map_or(Ok(5000), |v| v.parse())?);
    let seconds: u64 = arg(&args, "--seconds").map_or(Ok(60), |v| v.parse())?;
    let burst: Option<u64> = arg(&args, "--burst").map(|v| v.parse()).transpose()?;
    let prefix = arg(&args, "--prefix").unwrap_or_else(|| "edgeform".into());
    if let Some(url) = arg(&args, "--redis") {
        let mut c = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        redis::pipe()
            .cmd("SET")
            .arg(edgestate::keys::ROUTING)
            .arg(serde_json::to_string(&table(n))?)
            .cmd("HINCRBY")
            .arg(edgestate::keys::META)
            .arg("generation")
            .arg(1)
            .query_async::<()>(&mut c)
            .await?;
    }
    let mut o = MqttOptions::new(
        format!("sim-nodes-{}", std::process::id()),
        host,
        port.parse()?,
    );
    o.set_keep_alive(Duration::from_secs(30));
    o.set_inflight(1000);
    let (client, mut events) = AsyncClient::new(o, 10_000);
    let pump = tokio::spawn(async move {
        loop {
            if let Err(e) = events.poll().await {
                eprintln!("sim-nodes: broker: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    for i in 0..n {
        let node = format!("sim-{i}");
        client
            .publish(
                format!("{prefix}/status/{node}"),
                QoS::AtLeastOnce,
                true,
                "online",
            )
            .await?;
    }
    let started = Instant::now();
    let mut sent = 0u64;
    // A burst sends K rounds back to back; otherwise the nodes are spread
    // over the interval as real agents would be, until `--seconds` pass.
    let step = match burst {
        Some(_) => None,
        None => Some(interval / u32::try_from(n.max(1))?),
    };
    let mut seq = 0;
    while match burst {
        Some(k) => seq < k,
        None => started.elapsed() < Duration::from_secs(seconds),
    } {
        for i in 0..n {
            let node = format!("sim-{i}");
            client
                .publish(
                    format!("{prefix}/health/{node}"),
                    QoS::AtMostOnce,
                    true,
                    report(&node, i, seq),
                )
                .await?;
            sent += 1;
            if let Some(step) = step {
                tokio::time::sleep(step).await;
            }
        }
        seq += 1;
    }
    // Let the request queue drain.
    tokio::time::sleep(Duration::from_millis(500)).await;
    pump.abort();
    eprintln!(
        "sim-nodes: {sent} reports from {n} nodes in {:.2}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
