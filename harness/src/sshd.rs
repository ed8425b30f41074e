//! A real OpenSSH server (`sshd`, Debian `openssh-server`) on a free
//! loopback port, for the tests of everything that reaches a machine over
//! SSH (a private config repository fetched by `reconcile --pull`, the
//! installer channel). It runs in its own temp dir with its own host key,
//! accepts one client key (made here with `ssh-keygen`, no passphrase) for
//! the user running the tests, and nothing else: no passwords, no PAM.
//!
//! [`Sshd::known_hosts`] is a `known_hosts` file naming the real host key,
//! [`Sshd::other_known_hosts`] one naming a different key (for "an unknown
//! host key is refused").

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Process, find, free_port, spawn, wait_ready};

/// A running sshd and the client material that reaches it.
pub struct Sshd {
    pub process: Process,
    /// The client's private key (ed25519, no passphrase).
    pub client_key: PathBuf,
    /// Its public half, as it appears in `authorized_keys`.
    pub client_pub: String,
    /// `[127.0.0.1]:<port> <host key>`: the server as it really is.
    pub known_hosts: PathBuf,
    /// The same line with another key: what a man in the middle looks like.
    pub other_known_hosts: PathBuf,
}

impl Sshd {
    #[must_use]
    pub fn port(&self) -> u16 {
        self.process.port
    }

    /// The user the server accepts (the one running the tests).
    #[must_use]
    pub fn user() -> String {
        std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "root".to_owned())
    }

    /// `ssh` options that reach this server with the client key and the
    /// real known_hosts file (for `GIT_SSH_COMMAND` and the like).
    #[must_use]
    pub fn ssh_command(&self) -> String {
        format!(
            "ssh -p {} -i {} -o IdentitiesOnly=yes -o BatchMode=yes \
             -o StrictHostKeyChecking=yes -o UserKnownHostsFile={}",
            self.port(),
            self.client_key.display(),
            self.known_hosts.display()
        )
    }
}

fn keygen(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(name);
    let out = Command::new(find("ssh-keygen"))
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .output()
        .expect("ssh-keygen");
    assert!(
        out.status.success(),
        "ssh-keygen: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

fn public(key: &Path) -> String {
    let mut p = key.as_os_str().to_owned();
    p.push(".pub");
    std::fs::read_to_string(PathBuf::from(p))
        .expect("read public key")
        .trim()
        .to_owned()
}

/// Start sshd on a free loopback port.
///
/// # Panics
/// When `ssh-keygen` fails or sshd does not come up (its log is shown).
#[must_use]
pub fn sshd() -> Sshd {
    // sshd checks its privilege separation directory even when it only
    // serves one user; Debian creates it at boot, a container may not.
    let _ = std::fs::create_dir_all("/run/sshd");
    let mut last = String::new();
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().to_owned();
        let host_key = keygen(&d, "host_key");
        let other_key = keygen(&d, "other_host_key");
        let client_key = keygen(&d, "client_key");
        let client_pub = public(&client_key);
        std::fs::write(d.join("authorized_keys"), format!("{client_pub}\n"))
            .expect("authorized_keys");
        let port = free_port();
        let known = |key: &Path, file: &str| {
            let path = d.join(file);
            std::fs::write(&path, format!("[127.0.0.1]:{port} {}\n", public(key)))
                .expect("known_hosts");
            path
        };
        let known_hosts = known(&host_key, "known_hosts");
        let other_known_hosts = known(&other_key, "other_known_hosts");
        let log = d.join("sshd.log");
        let conf = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {host}\nPidFile {dir}/sshd.pid\n\
             AuthorizedKeysFile {dir}/authorized_keys\nStrictModes no\nUsePAM no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PubkeyAuthentication yes\nPermitRootLogin prohibit-password\n\
             AllowUsers {user}\nLogLevel VERBOSE\nSubsystem sftp internal-sftp\n",
            host = host_key.display(),
            dir = d.display(),
            user = Sshd::user(),
        );
        let conf_path = d.join("sshd_config");
        std::fs::write(&conf_path, conf).expect("write sshd_config");
        // -D: stay in the foreground (we stop it by pid); -e: log to stderr.
        let args = vec![
            "-D".to_owned(),
            "-e".to_owned(),
            "-f".to_owned(),
            conf_path.display().to_string(),
        ];
        let child = spawn("sshd", &args, &d, &log).expect("spawn sshd");
        let mut process = Process {
            child: Some(child),
            port,
            dir,
            log,
            binary: "sshd".into(),
            addr: std::net::Ipv4Addr::LOCALHOST,
            args,
        };
        // sshd answers a TCP connect with its banner once it listens.
        if wait_ready(&mut process, |port| {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) {
            return Sshd {
                process,
                client_key,
                client_pub,
                known_hosts,
                other_known_hosts,
            };
        }
        last = process.log();
    }
    panic!("sshd did not start:\n{last}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ssh(s: &Sshd, known_hosts: &Path) -> std::process::Output {
        Command::new(find("ssh"))
            .args(["-p", &s.port().to_string(), "-i"])
            .arg(&s.client_key)
            .args([
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=yes",
            ])
            .arg(format!("-oUserKnownHostsFile={}", known_hosts.display()))
            .arg(format!("{}@127.0.0.1", Sshd::user()))
            .arg("echo edgeform-ssh-ok")
            .output()
            .expect("ssh")
    }

    /// The server takes the client key when the host key is the known one,
    /// and the client refuses a server whose key is not.
    #[test]
    fn sshd_accepts_the_client_and_host_keys_are_checked() {
        let s = sshd();
        let ok = ssh(&s, &s.known_hosts);
        assert!(
            String::from_utf8_lossy(&ok.stdout).contains("edgeform-ssh-ok"),
            "{}\n{}",
            String::from_utf8_lossy(&ok.stderr),
            s.process.log()
        );
        let refused = ssh(&s, &s.other_known_hosts);
        assert!(!refused.status.success());
        assert!(
            String::from_utf8_lossy(&refused.stderr).contains("HOST IDENTIFICATION HAS CHANGED"),
            "{}",
            String::from_utf8_lossy(&refused.stderr)
        );
    }
}
