use super::*;

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One random RESP2/RESP3 value, written to `out`.
fn value(rng: &mut Rng, depth: u32, out: &mut Vec<u8>) {
    let pick = if depth >= 4 {
        rng.below(9)
    } else {
        rng.below(15)
    };
    let bytes = |rng: &mut Rng| -> Vec<u8> {
        let n = rng.below(40);
        // Any byte, CR and LF included: strings are counted, not scanned.
        (0..n).map(|_| rng.below(256) as u8).collect()
    };
    let text = |rng: &mut Rng| -> String {
        let n = rng.below(20);
        (0..n)
            .map(|_| char::from(b"ab \r:x0"[rng.below(7) as usize]))
            .collect::<String>()
            .replace("\r", "")
    };
    match pick {
        0 => out.extend_from_slice(format!("+{}\r\n", text(rng)).as_bytes()),
        1 => out.extend_from_slice(format!("-ERR {}\r\n", text(rng)).as_bytes()),
        2 => out.extend_from_slice(format!(":{}\r\n", rng.next() as i64).as_bytes()),
        3 => {
            let b = bytes(rng);
            out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
            out.extend_from_slice(&b);
            out.extend_from_slice(b"\r\n");
        }
        4 => out.extend_from_slice(b"$-1\r\n"),
        5 => out.extend_from_slice(b"_\r\n"),
        6 => out.extend_from_slice(format!(",{}.5\r\n", rng.below(1000)).as_bytes()),
        7 => out.extend_from_slice(if rng.below(2) == 0 {
            b"#t\r\n"
        } else {
            b"#f\r\n"
        }),
        8 => {
            let t = format!("txt:{}", text(rng));
            out.extend_from_slice(format!("={}\r\n{t}\r\n", t.len()).as_bytes());
        }
        9 => {
            let t = format!("ERR {}", text(rng));
            out.extend_from_slice(format!("!{}\r\n{t}\r\n", t.len()).as_bytes());
        }
        10 => out.extend_from_slice(b"*-1\r\n"),
        11 | 12 => {
            let n = rng.below(5);
            let kind = if pick == 11 { '*' } else { '~' };
            out.extend_from_slice(format!("{kind}{n}\r\n").as_bytes());
            for _ in 0..n {
                value(rng, depth + 1, out);
            }
        }
        13 => {
            let n = rng.below(4);
            out.extend_from_slice(format!("%{n}\r\n").as_bytes());
            for _ in 0..2 * n {
                value(rng, depth + 1, out);
            }
        }
        _ => {
            // A push: its kind first.
            let n = rng.below(4);
            out.extend_from_slice(format!(">{}\r\n$7\r\nmessage\r\n", n + 1).as_bytes());
            for _ in 0..n {
                value(rng, depth + 1, out);
            }
        }
    }
}

/// `data` fed in random pieces.
fn feed_in_pieces(rng: &mut Rng, scanner: &mut Scanner, data: &[u8]) -> Result<(), Refused> {
    let mut rest = data;
    while !rest.is_empty() {
        let n = (1 + rng.below(12) as usize).min(rest.len());
        scanner.feed(&rest[..n])?;
        rest = &rest[n..];
    }
    Ok(())
}

/// Whether the redis crate's own parser reads exactly `n` values from
/// `data`, nothing left over.
fn crate_reads_exactly(data: &[u8], n: u64) -> bool {
    let mut reader = data;
    let mut parser = redis::Parser::new();
    (0..n).all(|_| parser.parse_value(&mut reader).is_ok())
        && parser.parse_value(&mut reader).is_err()
}

#[test]
fn generated_replies_pass_in_any_pieces_and_end_where_the_redis_crate_ends_them() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..2_000 {
        let replies = 1 + rng.below(6);
        let mut data = Vec::new();
        for _ in 0..replies {
            value(&mut rng, 0, &mut data);
        }
        let mut scanner = Scanner::new(LIMITS);
        feed_in_pieces(&mut rng, &mut scanner, &data)
            .unwrap_or_else(|e| panic!("round {round}: {e}: {:?}", String::from_utf8_lossy(&data)));
        assert_eq!(scanner.replies(), replies, "round {round}");
        assert!(crate_reads_exactly(&data, replies), "round {round}");
    }
}

fn refused(data: &[u8], limits: Limits) -> Refused {
    let mut scanner = Scanner::new(limits);
    scanner
        .feed(data)
        .expect_err(&format!("{:?} passed", String::from_utf8_lossy(data)))
}

#[test]
fn an_announced_string_over_the_limit_is_refused_before_its_bytes() {
    let r = refused(b"$20000000000\r\n", LIMITS);
    assert_eq!(r, Refused::String(20_000_000_000));
    assert!(r.to_string().contains("20000000000"), "{r}");
    // A string's length may not be negative but for `$-1` (null).
    assert_eq!(refused(b"=-1\r\n", LIMITS), Refused::String(-1));
    assert_eq!(refused(b"!-5\r\n", LIMITS), Refused::String(-5));
    let mut s = Scanner::new(LIMITS);
    s.feed(b"$-1\r\n").unwrap();
    assert_eq!(s.replies(), 1);
}

#[test]
fn a_reply_is_bounded_in_bytes_values_lines_and_depth_as_a_whole() {
    let small = Limits {
        string: 100,
        line: 32,
        reply: 1_000,
        values: 50,
        process: u64::MAX,
    };
    // Ten strings of 100 bytes in one array: each fits, the reply does not.
    let mut data = b"*10\r\n".to_vec();
    for _ in 0..10 {
        data.extend_from_slice(b"$100\r\n");
        data.extend_from_slice(&[b'x'; 100]);
        data.extend_from_slice(b"\r\n");
    }
    assert_eq!(refused(&data, small), Refused::Reply);
    // The same ten strings as ten replies pass: the count starts again.
    let mut s = Scanner::new(small);
    for _ in 0..10 {
        s.feed(b"$100\r\n").unwrap();
        s.feed(&[b'x'; 100]).unwrap();
        s.feed(b"\r\n").unwrap();
    }
    assert_eq!(s.replies(), 10);
    // An announced count over the values is refused before its values.
    assert_eq!(refused(b"*51\r\n", small), Refused::Values);
    assert_eq!(refused(b"%26\r\n", small), Refused::Values);
    assert_eq!(
        refused(b"%9223372036854775807\r\n", LIMITS),
        Refused::Values
    );
    // A line without its end is refused once it is too long.
    let mut line = b"+".to_vec();
    line.extend_from_slice(&[b'a'; 40]);
    assert_eq!(refused(&line, small), Refused::Line);
    // A lone "\n" does not end a line; "\r\n" split between reads does.
    let mut s = Scanner::new(small);
    s.feed(b"+a\nb\r").unwrap();
    assert_eq!(s.replies(), 0);
    s.feed(b"\n").unwrap();
    assert_eq!(s.replies(), 1);
    // Nesting.
    let deep = "*1\r\n".repeat(DEPTH_MAX + 1);
    assert!(matches!(
        refused(deep.as_bytes(), LIMITS),
        Refused::Framing(_)
    ));
    assert!(matches!(refused(b"?\r\n", LIMITS), Refused::Framing(_)));
    assert!(matches!(refused(b"$x\r\n", LIMITS), Refused::Framing(_)));
}

#[test]
fn hostile_bytes_never_panic_the_scanner() {
    let mut rng = Rng(7);
    for _ in 0..20_000 {
        let mut data = Vec::new();
        value(&mut rng, 0, &mut data);
        // Mutate a few bytes, from the RESP alphabet and digits mostly.
        for _ in 0..1 + rng.below(4) {
            if data.is_empty() {
                break;
            }
            let i = rng.below(data.len() as u64) as usize;
            data[i] = b"*$%|>=!-+:\r\n09_~"[rng.below(16) as usize];
        }
        let mut scanner = Scanner::new(LIMITS);
        let _ = feed_in_pieces(&mut rng, &mut scanner, &data);
    }
}

/// A server that answers every connection with a string it announces as
/// 20 GB and then sends bytes until the reader hangs up; returns its port
/// and how many bytes it sent in all.
async fn endless_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = s.read(&mut request).await;
                let _ = s.write_all(b"$20000000000\r\n").await;
                let chunk = vec![b'x'; 1 << 20];
                while s.write_all(&chunk).await.is_ok() {
                    counter.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    (port, sent)
}

#[tokio::test]
async fn a_server_announcing_an_endless_reply_fails_the_connection_at_once() {
    let (port, sent) = endless_server().await;
    let target = crate::RedisTarget::Url {
        url: format!("redis://127.0.0.1:{port}"),
        username: None,
        password_env: None,
        tls: None,
    };
    let started = std::time::Instant::now();
    let e = crate::master(&target, "edge-1")
        .await
        .expect_err("a 20 GB reply was taken");
    let said = crate::one_line(&e);
    assert!(
        said.contains("announced a string of 20000000000 bytes"),
        "{said}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    // The reader hung up after the header: the server got out what the
    // socket buffers hold, not the 20 GB.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(sent < 64 << 20, "the server sent {sent} bytes");
}

#[tokio::test]
async fn replies_being_read_on_every_connection_share_one_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let limits = Limits {
        process: 4_000_000,
        ..LIMITS
    };
    let reading = |n: usize| {
        let (mut server, client) = tokio::io::duplex(1 << 16);
        let mut ours = Bounded::new(client, limits, format!("server-{n}"));
        async move {
            // A string of 3 MB announced, 2.5 MB of it sent: unfinished.
            server.write_all(b"$3000000\r\n").await.unwrap();
            let chunk = vec![b'x'; 2_500_000];
            let send = tokio::spawn(async move {
                let _ = server.write_all(&chunk).await;
                server
            });
            let mut got = 0;
            let mut buf = vec![0u8; 1 << 16];
            let end = loop {
                match ours.read(&mut buf).await {
                    Ok(n) => {
                        got += n;
                        if got >= 2_500_010 {
                            break Ok(());
                        }
                    }
                    Err(e) => break Err(e),
                }
            };
            (ours, send, end)
        }
    };
    let (first, _s1, end) = reading(1).await;
    end.expect("one unfinished reply fits the budget");
    let (_second, _s2, end) = reading(2).await;
    let e = end.expect_err("a second one would pass the budget");
    let why = e.get_ref().and_then(|e| e.downcast_ref::<Refused>());
    assert_eq!(why, Some(&Refused::Process));
    // The first stream gone, its share is free again.
    drop(first);
    let (_third, _s3, end) = reading(3).await;
    end.expect("the budget came back");
}

/// A server that answers `ROLE` as a master and then every later request
/// with a string it announces as 20 GB.
async fn master_then_endless_server() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let _ = s.read(&mut request).await;
                let _ = s.write_all(b"*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n").await;
                let _ = s.read(&mut request).await;
                let _ = s.write_all(b"$20000000000\r\n").await;
                let chunk = vec![b'x'; 1 << 16];
                while s.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    port
}

#[tokio::test]
async fn a_refused_reply_is_named_in_the_nodes_error_for_a_few_seconds() {
    let port = master_then_endless_server().await;
    let target = crate::RedisTarget::Url {
        url: format!("redis://127.0.0.1:{port}"),
        username: None,
        password_env: None,
        tls: None,
    };
    let mut con = crate::master(&target, "edge-refused").await.unwrap();
    let get = || redis::cmd("GET").arg("k").clone();
    // The request in flight fails with the cause, and is left as it is ...
    let first = get()
        .query_async::<Option<String>>(&mut con)
        .await
        .expect_err("a 20 GB reply was taken");
    let first = crate::one_line(&crate::with_refusal("edge-refused", first.into()));
    assert_eq!(
        first.matches("announced a string").count(),
        1,
        "said once: {first}"
    );
    // ... a later one on the same connection the redis crate reports only
    // as a connection gone ...
    let e = get()
        .query_async::<Option<String>>(&mut con)
        .await
        .expect_err("the connection was dropped");
    let bare = crate::one_line(&anyhow::Error::from(e.clone()));
    assert!(!bare.contains("announced"), "{bare}");
    // ... the node's error says why.
    let said = crate::one_line(&crate::with_refusal(
        "edge-refused",
        anyhow::Error::from(e.clone()).context("reading edgeform:meta"),
    ));
    assert!(
        said.starts_with(&format!("127.0.0.1:{port} sent a reply past the limits")),
        "{said}"
    );
    assert!(
        said.contains("announced a string of 20000000000 bytes"),
        "{said}"
    );
    assert!(said.contains("reading edgeform:meta"), "{said}");
    // Another node's error, or one not caused by a dropped connection, is
    // left as it is.
    let other = crate::one_line(&crate::with_refusal("edge-other", e.into()));
    assert!(!other.contains("announced"), "{other}");
    let unrelated = crate::one_line(&crate::with_refusal(
        "edge-refused",
        anyhow::anyhow!("no answer within 5s"),
    ));
    assert_eq!(unrelated, "no answer within 5s");
    // Another connection to the node (another task's) does not wipe it ...
    let _con = crate::master(&target, "edge-refused").await.unwrap();
    assert!(refused_on("edge-refused").is_some());
    // ... time does: a drop seconds later has another cause.
    let long_ago = std::time::Instant::now()
        .checked_sub(REFUSAL_EXPLAINS)
        .expect("the clock is past 5 s");
    REFUSALS
        .lock()
        .unwrap()
        .get_mut("edge-refused")
        .expect("kept")
        .2 = long_ago;
    assert_eq!(refused_on("edge-refused"), None);
    let later = crate::with_refusal("edge-refused", anyhow::Error::from(e_again()));
    assert!(!crate::one_line(&later).contains("announced"));
}

/// A dropped connection's error, as the redis crate makes it.
fn e_again() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
}
