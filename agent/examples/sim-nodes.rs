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
//!
//! With `--mode full|summary`, every node is its own MQTT client (status
//! with a last will, its report every interval at its own phase) that
//! also reads what an agent reads: `full` every node's health
//! (`health/+`, as agents did before regional summaries), `summary` the
//! regions' summaries (`summary/+`; real agents named with `--extra
//! agent-r0:r0,…` summarize). `--regions R` spreads the nodes over R
//! regions. At the end it prints one JSON line: the messages its nodes
//! received and the broker's `$SYS` send rates after `--warmup` seconds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use edgestate::routing::{GeoSettings, Node, RoutingTable, Zone};
use rumqttc::{AsyncClient, MqttOptions, QoS};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn report(node: &str, i: usize, seq: u64, interval_ms: u64) -> Vec<u8> {
    let ts = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    serde_json::to_vec(&serde_json::json!({
        "node": node, "ts": ts, "interval_ms": interval_ms,
        "play_sessions": (i as u64 * 7 + seq) % 500, "out_kbit": 1000 + i as u64,
        "streams": [format!("cam{}", i % 20), format!("cam{}", (i + 1) % 20)],
        "config": {"commit": "sim", "generation": 1},
        "purge": {"queue": 0, "processing": 0},
        "redis": {"ok": true, "role": "master"}, "version": "sim",
    }))
    .unwrap_or_default()
}

fn table(n: usize, regions: usize, extra: &[(String, String)]) -> RoutingTable {
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
    let region = |i: usize| {
        if regions > 1 {
            format!("r{}", i % regions)
        } else {
            "eu".into()
        }
    };
    let nodes = (0..n)
        .map(|i| (format!("sim-{i}"), region(i), i))
        .chain(
            extra
                .iter()
                .enumerate()
                .map(|(k, (name, r))| (name.clone(), r.clone(), n + k)),
        )
        .map(|(name, region, i)| {
            (
                name,
                Node {
                    roles: vec![if i % 3 == 0 { "ingest" } else { "edge" }.into()],
                    region,
                    zone: Some(format!("z{}", i % 10)),
                    public_url: Some(format!("https://n{i}.example.net")),
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
    let regions: usize = arg(&args, "--regions").map_or(Ok(1), |v| v.parse())?;
    let extra: Vec<(String, String)> = arg(&args, "--extra")
        .unwrap_or_default()
        .split(',')
        .filter_map(|e| e.split_once(':'))
        .map(|(n, r)| (n.to_owned(), r.to_owned()))
        .collect();
    let mode = arg(&args, "--mode").unwrap_or_else(|| "publish".into());
    let warmup: u64 = arg(&args, "--warmup").map_or(Ok(10), |v| v.parse())?;
    if let Some(url) = arg(&args, "--redis") {
        let mut c = redis::Client::open(url)?
            .get_multiplexed_async_connection()
            .await?;
        redis::pipe()
            .cmd("SET")
            .arg(edgestate::keys::ROUTING)
            .arg(serde_json::to_string(&table(n, regions, &extra))?)
            .cmd("HINCRBY")
            .arg(edgestate::keys::META)
            .arg("generation")
            .arg(1)
            .query_async::<()>(&mut c)
            .await?;
    }
    if mode != "publish" {
        return nodes_as_clients(&NodesRun {
            host: host.to_owned(),
            port: port.parse()?,
            prefix,
            n,
            interval,
            seconds,
            warmup,
            full: mode == "full",
        })
        .await;
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
                    report(
                        &node,
                        i,
                        seq,
                        u64::try_from(interval.as_millis()).unwrap_or(5000),
                    ),
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

struct NodesRun {
    host: String,
    port: u16,
    prefix: String,
    n: usize,
    interval: Duration,
    seconds: u64,
    warmup: u64,
    /// Read every node's health (before summaries) or the summaries.
    full: bool,
}

/// Every node its own client: status and last will, a report every
/// interval at its own phase, and the subscriptions an agent makes.
async fn nodes_as_clients(run: &NodesRun) -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let received = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let end = started + Duration::from_secs(run.seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..run.n {
        let node = format!("sim-{i}");
        let mut o = MqttOptions::new(format!("sim-node-{i}"), run.host.clone(), run.port);
        o.set_keep_alive(Duration::from_secs(30));
        // As the agent: a region's summary is larger than rumqttc's
        // default 10 KiB.
        let max = edgestate::mqtt::SUMMARY_MAX_BYTES + (64 << 10);
        o.set_max_packet_size(max, max);
        let status = format!("{}/status/{node}", run.prefix);
        o.set_last_will(rumqttc::LastWill::new(
            &status,
            "offline",
            QoS::AtLeastOnce,
            true,
        ));
        let (client, mut events) = AsyncClient::new(o, 100);
        let got = received.clone();
        tasks.spawn(async move {
            loop {
                match events.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(_))) => {
                        got.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
        let prefix = run.prefix.clone();
        let interval = run.interval;
        let full = run.full;
        let phase = interval.mul_f64(i as f64 / run.n.max(1) as f64);
        tasks.spawn(async move {
            let subscribed = if full {
                client
                    .subscribe(format!("{prefix}/health/+"), QoS::AtMostOnce)
                    .await
            } else {
                client
                    .subscribe(format!("{prefix}/summary/+"), QoS::AtMostOnce)
                    .await
            };
            let _ = subscribed;
            let _ = client
                .subscribe(format!("{prefix}/status/+"), QoS::AtMostOnce)
                .await;
            let _ = client
                .publish(&status, QoS::AtLeastOnce, true, "online")
                .await;
            tokio::time::sleep(phase).await;
            let mut seq = 0;
            while Instant::now() < end {
                let _ = client
                    .publish(
                        format!("{prefix}/health/{node}"),
                        QoS::AtMostOnce,
                        true,
                        report(
                            &node,
                            i,
                            seq,
                            u64::try_from(interval.as_millis()).unwrap_or(5000),
                        ),
                    )
                    .await;
                seq += 1;
                tokio::time::sleep(interval).await;
            }
            let _ = client
                .publish(&status, QoS::AtLeastOnce, true, "offline")
                .await;
            let _ = client.disconnect().await;
        });
    }
    // The broker's own counts ($SYS, every sys_interval).
    let mut o = MqttOptions::new(
        format!("sim-sys-{}", std::process::id()),
        run.host.clone(),
        run.port,
    );
    o.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(o, 100);
    client
        .subscribe("$SYS/broker/publish/messages/sent", QoS::AtMostOnce)
        .await?;
    client
        .subscribe("$SYS/broker/messages/sent", QoS::AtMostOnce)
        .await?;
    let mut first: BTreeMap<String, (Instant, f64)> = BTreeMap::new();
    let mut last: BTreeMap<String, (Instant, f64)> = BTreeMap::new();
    let mut received_at_warmup = None;
    let warm = started + Duration::from_secs(run.warmup);
    while Instant::now() < end {
        let left = end.saturating_duration_since(Instant::now());
        let Ok(event) = tokio::time::timeout(left, events.poll()).await else {
            break;
        };
        if Instant::now() >= warm && received_at_warmup.is_none() {
            received_at_warmup = Some((Instant::now(), received.load(Ordering::Relaxed)));
        }
        if let Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) = event
            && Instant::now() >= warm
            && let Ok(v) = String::from_utf8_lossy(&p.payload).trim().parse::<f64>()
        {
            first.entry(p.topic.clone()).or_insert((Instant::now(), v));
            last.insert(p.topic.clone(), (Instant::now(), v));
        }
    }
    let rate = |topic: &str| {
        let (t0, v0) = first.get(topic)?;
        let (t1, v1) = last.get(topic)?;
        let dt = t1.duration_since(*t0).as_secs_f64();
        (dt > 0.0).then(|| (v1 - v0) / dt)
    };
    let (t_w, r_w) = received_at_warmup.unwrap_or((started, 0));
    let dt = Instant::now().duration_since(t_w).as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let nodes_rate = (received.load(Ordering::Relaxed) - r_w) as f64 / dt.max(0.001);
    println!(
        "{}",
        serde_json::json!({
            "nodes": run.n,
            "received_per_s": nodes_rate,
            "publish_sent_per_s": rate("$SYS/broker/publish/messages/sent"),
            "messages_sent_per_s": rate("$SYS/broker/messages/sent"),
        })
    );
    tasks.abort_all();
    Ok(())
}
