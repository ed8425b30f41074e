//! A viewer with a real public source address: a network namespace joined
//! to this host by a veth pair (`ip netns`, as root). The viewer's side
//! holds the address (e.g. 81.2.69.142, GB in MaxMind's test database);
//! the host's side gets a private gateway address that servers under test
//! listen on (loopback is not reachable from the namespace). Dropping the
//! viewer deletes the namespace (which deletes the pair) and its route.
//!
//! The host route to the viewer's address is global, so two viewers with
//! the same address cannot exist at once, even across test processes: a
//! lock file (`/tmp/edgeform-netns-<addr>.lock`, holding the owner's pid;
//! a dead owner's lock is taken over) serialises them.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// A network namespace whose traffic leaves from `addr`.
pub struct Viewer {
    ns: String,
    host_if: String,
    /// The viewer's own (public) address.
    pub addr: Ipv4Addr,
    /// The host's side of the pair: what the viewer connects to.
    pub gateway: Ipv4Addr,
    lock: PathBuf,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Take the lock for `addr` (waiting up to a minute for another holder).
fn lock(addr: Ipv4Addr) -> PathBuf {
    let path = PathBuf::from(format!("/tmp/edgeform-netns-{addr}.lock"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
        {
            Ok(mut f) => {
                use std::io::Write;
                let _ = write!(f, "{}", std::process::id());
                return path;
            }
            Err(_) => {
                let owner = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok());
                if owner.is_some_and(|p| !pid_alive(p)) {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                assert!(
                    Instant::now() < deadline,
                    "netns viewer {addr}: {} stays locked by pid {owner:?}",
                    path.display()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

impl Viewer {
    /// A namespace whose only address is `addr`, reaching this host at
    /// [`Viewer::gateway`].
    ///
    /// # Panics
    /// Not root, or `ip` refuses (the message says which command).
    #[must_use]
    pub fn new(addr: Ipv4Addr) -> Viewer {
        let lock = lock(addr);
        // Left over by a test process that was killed: the same address's
        // route and namespace go first.
        let _ = ip(&["route", "del", &format!("{addr}/32")]);
        let tag = format!("{:x}", std::process::id() ^ (u32::from(addr) & 0xffff));
        let n = (std::process::id() % 250) + 1;
        let gateway = Ipv4Addr::new(10, 251, u8::try_from(n).unwrap_or(1), 1);
        let ns = format!("efv-{tag}");
        let host_if = format!("efh-{tag}");
        let peer_if = format!("efn-{tag}");
        let _ = ip(&["netns", "del", &ns]);
        let _ = ip(&["link", "del", &host_if]);
        let v = Viewer {
            ns,
            host_if,
            addr,
            gateway,
            lock,
        };
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), v.ns.clone()],
            vec![
                "link".into(),
                "add".into(),
                v.host_if.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                peer_if.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                peer_if.clone(),
                "netns".into(),
                v.ns.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{gateway}/32"),
                "dev".into(),
                v.host_if.clone(),
            ],
            vec!["link".into(), "set".into(), v.host_if.clone(), "up".into()],
            vec![
                "route".into(),
                "add".into(),
                format!("{addr}/32"),
                "dev".into(),
                v.host_if.clone(),
                "src".into(),
                gateway.to_string(),
            ],
        ];
        let in_ns: Vec<Vec<String>> = vec![
            vec![
                "addr".into(),
                "add".into(),
                format!("{addr}/32"),
                "dev".into(),
                peer_if.clone(),
            ],
            vec!["link".into(), "set".into(), peer_if.clone(), "up".into()],
            vec!["link".into(), "set".into(), "lo".into(), "up".into()],
            vec![
                "route".into(),
                "add".into(),
                format!("{gateway}/32"),
                "dev".into(),
                peer_if.clone(),
                "src".into(),
                addr.to_string(),
            ],
            vec![
                "route".into(),
                "add".into(),
                "default".into(),
                "via".into(),
                gateway.to_string(),
                "dev".into(),
                peer_if,
            ],
        ];
        for s in &steps {
            let args: Vec<&str> = s.iter().map(String::as_str).collect();
            if let Err(e) = ip(&args) {
                panic!("netns viewer {addr}: {e} (needs root and iproute2)");
            }
        }
        for s in &in_ns {
            let mut args = vec!["netns", "exec", v.ns.as_str(), "ip"];
            args.extend(s.iter().map(String::as_str));
            if let Err(e) = ip(&args) {
                panic!("netns viewer {addr}: {e}");
            }
        }
        v
    }

    /// The namespace's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.ns
    }

    /// `program` run inside the namespace (`ip netns exec <ns> program`).
    #[must_use]
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns, program]);
        c
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = ip(&["route", "del", &format!("{}/32", self.addr)]);
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = std::fs::remove_file(&self.lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The viewer's packets leave from its own address: a listener on
    /// the gateway sees 81.2.69.142 as the peer.
    #[test]
    fn viewer_connects_from_its_public_address() {
        let v = Viewer::new(Ipv4Addr::new(81, 2, 69, 142));
        let l = std::net::TcpListener::bind((v.gateway, 0)).expect("bind the gateway");
        let port = l.local_addr().unwrap().port();
        let mut child = v
            .command("bash")
            .args([
                "-c",
                &format!("exec 3<>/dev/tcp/{}/{port}; echo hi >&3", v.gateway),
            ])
            .spawn()
            .expect("bash in the namespace");
        let (_, peer) = l.accept().expect("accept");
        assert_eq!(peer.ip(), std::net::IpAddr::V4(v.addr));
        let _ = child.wait();
    }
}
