//! The command policy and the runner.
//!
//! [`check`] is the whole policy, pure and table-tested: a signature when
//! the agent requires one, not expired, an action named in `agent.yaml`,
//! exactly its declared arguments, each free of shell metacharacters and
//! matching its anchored regex. Only then does [`run`] start the action's
//! fixed argv — never through a shell — in its own process group with a
//! clean environment, killing the group at the timeout.
//!
//! Run-once is enforced by the pipeline ([`super::handle`]) with the id
//! recorded in local Redis before anything runs.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use edgestate::cmdkey::{CommandKeys, SigError};
use edgestate::mqtt::{self as wire, Command, Outcome, TAIL_BYTES};
use tokio::io::AsyncReadExt;

use crate::config::{Action, placeholder};

/// Characters never accepted in an argument value, whatever the action's
/// regex says: argv is never given to a shell, but an action's program
/// may be a script that is careless with its arguments.
pub const METACHARACTERS: &[char] = &[
    ';', '&', '|', '$', '`', '<', '>', '(', ')', '\\', '\'', '"', '*', '?', '[', ']', '{', '}',
    '!', '#', '~',
];

/// Clock skew tolerated for `issued_at` in the future.
pub const MAX_SKEW_SECS: u64 = 300;

/// Which rule refused a command: this, never the reason's text, decides
/// what the refusal may do (see [`Refusal::claims_id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    /// Unsigned or a bad signature: not from whoever holds the key.
    Unauthenticated,
    /// Arrived after `expires_at`.
    Expired,
    /// Authentic and in time, but not allowed (action, arguments, times).
    Policy,
}

/// Why a command does not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub kind: RefusalKind,
    /// `expired` for [`RefusalKind::Expired`], else `refused`.
    pub status: Outcome,
    pub reason: String,
}

impl Refusal {
    fn new(kind: RefusalKind, reason: impl Into<String>) -> Refusal {
        let status = match kind {
            RefusalKind::Expired => Outcome::Expired,
            RefusalKind::Unauthenticated | RefusalKind::Policy => Outcome::Refused,
        };
        Refusal {
            kind,
            status,
            reason: reason.into(),
        }
    }

    /// Whether the refused command claims its id (so a redelivery gets the
    /// same answer). An unauthenticated command must not: anyone could
    /// burn a real command's id in advance. An expired one need not: it
    /// can never run anyway.
    #[must_use]
    pub fn claims_id(&self) -> bool {
        self.kind == RefusalKind::Policy
    }
}

fn refuse(reason: impl Into<String>) -> Refusal {
    Refusal::new(RefusalKind::Policy, reason)
}

/// Decide whether `cmd` may run on `node` at `now`; the argv to run.
///
/// # Errors
/// The refusal, with its status (`refused` or `expired`) and reason.
pub fn check(
    cmd: &Command,
    node: &str,
    actions: &BTreeMap<String, Action>,
    key: Option<&[u8]>,
    now: u64,
) -> Result<Vec<String>, Refusal> {
    let keys = CommandKeys {
        ed25519: None,
        hmac: key.map(<[u8]>::to_vec),
    };
    check_with(cmd, node, actions, &keys, now)
}

/// [`check`] with every key the agent accepts: the control host's ed25519
/// public key and, during the migration, the legacy shared HMAC key.
///
/// # Errors
/// See [`check`].
pub fn check_with(
    cmd: &Command,
    node: &str,
    actions: &BTreeMap<String, Action>,
    keys: &CommandKeys,
    now: u64,
) -> Result<Vec<String>, Refusal> {
    if keys.required() {
        match keys.verify(cmd, node) {
            Ok(_) => {}
            Err(SigError::Unsigned) => {
                return Err(Refusal::new(
                    RefusalKind::Unauthenticated,
                    "unsigned: this agent only runs signed commands",
                ));
            }
            Err(SigError::SchemeNotAccepted) => {
                return Err(Refusal::new(
                    RefusalKind::Unauthenticated,
                    if keys.ed25519.is_some() && keys.hmac.is_none() {
                        "bad signature: this agent only accepts commands signed ed25519 by the control host (the shared HMAC key is retired)"
                    } else {
                        "bad signature: a signature scheme this agent does not accept"
                    },
                ));
            }
            Err(SigError::Bad) => {
                return Err(Refusal::new(
                    RefusalKind::Unauthenticated,
                    "bad signature (wrong key, another node, or altered)",
                ));
            }
        }
    }
    if cmd.expires_at < cmd.issued_at {
        return Err(refuse("expires_at is before issued_at"));
    }
    if cmd.expires_at - cmd.issued_at > wire::COMMAND_LIFETIME_MAX_SECS {
        return Err(refuse(format!(
            "lives {}s (expires_at - issued_at); a command lives at most {}s",
            cmd.expires_at - cmd.issued_at,
            wire::COMMAND_LIFETIME_MAX_SECS
        )));
    }
    if now > cmd.expires_at {
        return Err(Refusal::new(
            RefusalKind::Expired,
            format!(
                "expired {}s ago (expires_at {}, now {now})",
                now - cmd.expires_at,
                cmd.expires_at
            ),
        ));
    }
    if cmd.issued_at > now + MAX_SKEW_SECS {
        return Err(refuse(format!(
            "issued_at is {}s in the future: check the clocks",
            cmd.issued_at - now
        )));
    }
    let Some(action) = actions.get(&cmd.action) else {
        let known: Vec<&str> = actions.keys().map(String::as_str).collect();
        return Err(refuse(format!(
            "unknown action `{}` (this node allows: {})",
            cmd.action,
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        )));
    };
    if let Some(extra) = cmd.args.keys().find(|k| !action.args.contains_key(*k)) {
        return Err(refuse(format!(
            "action `{}` takes no argument `{extra}`",
            cmd.action
        )));
    }
    for (name, re) in &action.args {
        let Some(value) = cmd.args.get(name) else {
            return Err(refuse(format!(
                "action `{}` needs argument `{name}`",
                cmd.action
            )));
        };
        if let Some(c) = value
            .chars()
            .find(|c| METACHARACTERS.contains(c) || c.is_whitespace() || c.is_control())
        {
            return Err(refuse(format!(
                "argument `{name}` contains {c:?}: shell metacharacters, whitespace and control characters are never accepted"
            )));
        }
        if value.starts_with('-') {
            return Err(refuse(format!(
                "argument `{name}` starts with `-` (it would be read as an option)"
            )));
        }
        if !re.is_match(value) {
            return Err(refuse(format!(
                "argument `{name}` = `{value}` does not match `{}`",
                re.as_str()
                    .strip_prefix("^(?:")
                    .and_then(|r| r.strip_suffix(")$"))
                    .unwrap_or(re.as_str())
            )));
        }
    }
    Ok(action
        .argv
        .iter()
        .map(|element| match placeholder(element) {
            Some(name) => cmd.args.get(name).cloned().unwrap_or_default(),
            None => element.clone(),
        })
        .collect())
}

/// What running an action gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    pub status: Outcome,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub duration: Duration,
    pub reason: Option<String>,
}

/// The environment an action sees: nothing inherited but a fixed PATH,
/// plus who asked.
fn environment(node: &str, id: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        ),
        ("LANG", "C.UTF-8".into()),
        ("EDGEFORM_NODE", node.to_owned()),
        ("EDGEFORM_COMMAND_ID", id.to_owned()),
    ]
}

/// Run `argv` (no shell) with `timeout`; at the timeout the whole process
/// group is killed.
pub async fn run(argv: &[String], timeout: Duration, node: &str, id: &str) -> Ran {
    let started = Instant::now();
    let Some((program, args)) = argv.split_first() else {
        return failed(started, "empty argv".into());
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(environment(node, id))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => return failed(started, format!("cannot start {program}: {e}")),
    };
    let stdout = child.stdout.take().map(|s| tokio::spawn(read_tail(s)));
    let stderr = child.stderr.take().map(|s| tokio::spawn(read_tail(s)));
    let (exit, reason) = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => (status.code(), None),
        Ok(Err(e)) => (None, Some(format!("waiting for the action: {e}"))),
        Err(_) => {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok())
                && let Some(pid) = rustix::process::Pid::from_raw(pid)
            {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.kill().await;
            (
                None,
                Some(format!(
                    "timed out after {}; killed",
                    crate::config::show_duration(timeout)
                )),
            )
        }
    };
    // A grandchild that left the group may hold the pipes open: do not wait
    // for it past a moment.
    let collect = |h: Option<tokio::task::JoinHandle<Vec<u8>>>| async move {
        match h {
            None => String::new(),
            Some(h) => match tokio::time::timeout(Duration::from_secs(1), h).await {
                Ok(Ok(bytes)) => edgestate::mqtt::tail(&bytes),
                _ => String::new(),
            },
        }
    };
    let stdout = collect(stdout).await;
    let stderr = collect(stderr).await;
    let status = match (exit, &reason) {
        (Some(0), None) => Outcome::Ok,
        _ => Outcome::Failed,
    };
    let reason = reason.or_else(|| match exit {
        Some(0) => None,
        Some(code) => Some(format!("exited with status {code}")),
        None => Some("killed by a signal".into()),
    });
    Ran {
        status,
        exit_code: exit,
        stdout,
        stderr,
        duration: started.elapsed(),
        reason,
    }
}

fn failed(started: Instant, reason: String) -> Ran {
    Ran {
        status: Outcome::Failed,
        exit_code: None,
        stdout: String::new(),
        stderr: String::new(),
        duration: started.elapsed(),
        reason: Some(reason),
    }
}

/// Read to the end, keeping only the last [`TAIL_BYTES`].
async fn read_tail(mut r: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                kept.extend_from_slice(&buf[..n]);
                if kept.len() > 2 * TAIL_BYTES {
                    kept.drain(..kept.len() - TAIL_BYTES);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actions() -> BTreeMap<String, Action> {
        let c = crate::config::parse(
            "agent.yaml",
            "node: n\nregion: r\nredis: {url: redis://x}\nactions:\n  \
             add-peer:\n    argv: [/usr/bin/echo, peer, \"{peer}\", \"{zone}\"]\n    \
             args: {peer: \"[0-9a-f.:]+\", zone: \"[a-z0-9-]+\"}\n  \
             reload:\n    argv: [/usr/bin/true]\n",
        )
        .unwrap();
        c.actions
    }

    fn cmd(action: &str, args: &[(&str, &str)]) -> Command {
        Command {
            id: "c1".into(),
            action: action.into(),
            args: args
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            issued_at: 1000,
            expires_at: 1300,
            sig: None,
        }
    }

    #[test]
    fn allowed_commands_fill_whole_elements() {
        let a = actions();
        let argv = check(
            &cmd("add-peer", &[("peer", "10.0.0.1"), ("zone", "eu-1")]),
            "n",
            &a,
            None,
            1100,
        )
        .unwrap();
        assert_eq!(argv, ["/usr/bin/echo", "peer", "10.0.0.1", "eu-1"]);
        assert_eq!(
            check(&cmd("reload", &[]), "n", &a, None, 1100).unwrap(),
            ["/usr/bin/true"]
        );
    }

    #[test]
    fn refusals() {
        let a = actions();
        let refused = |c: Command, now: u64, key: Option<&[u8]>| {
            check(&c, "n", &a, key, now).expect_err("refused")
        };
        let r = refused(cmd("rm", &[]), 1100, None);
        assert_eq!(r.status, Outcome::Refused);
        assert!(r.reason.contains("unknown action `rm`") && r.reason.contains("add-peer, reload"));
        let r = refused(cmd("reload", &[("x", "1")]), 1100, None);
        assert!(r.reason.contains("no argument `x`"), "{}", r.reason);
        let r = refused(cmd("add-peer", &[("peer", "10.0.0.1")]), 1100, None);
        assert!(r.reason.contains("needs argument `zone`"), "{}", r.reason);
        let r = refused(
            cmd("add-peer", &[("peer", "ZZ"), ("zone", "eu")]),
            1100,
            None,
        );
        assert!(
            r.reason.contains("does not match `[0-9a-f.:]+`"),
            "{}",
            r.reason
        );
        // Anchored: a matching prefix is not enough.
        let r = refused(
            cmd("add-peer", &[("peer", "10.0.0.1"), ("zone", "eu_x")]),
            1100,
            None,
        );
        assert!(r.reason.contains("does not match"), "{}", r.reason);
        for bad in [
            "eu;reboot",
            "$(id)",
            "`id`",
            "a|b",
            "a b",
            "a\nb",
            "a&&b",
            "x>y",
        ] {
            let r = refused(
                cmd("add-peer", &[("peer", "10.0.0.1"), ("zone", bad)]),
                1100,
                None,
            );
            assert!(r.reason.contains("never accepted"), "{bad:?}: {}", r.reason);
        }
        let r = refused(
            cmd("add-peer", &[("peer", "10.0.0.1"), ("zone", "-rf")]),
            1100,
            None,
        );
        assert!(r.reason.contains("option"), "{}", r.reason);
        let r = refused(cmd("reload", &[]), 1301, None);
        assert_eq!(r.status, Outcome::Expired);
        assert!(
            check(&cmd("reload", &[]), "n", &a, None, 1300).is_ok(),
            "expires_at itself is still valid"
        );
        let mut future = cmd("reload", &[]);
        future.issued_at = 5000;
        future.expires_at = 6000;
        assert!(refused(future, 1100, None).reason.contains("future"));
        let mut backwards = cmd("reload", &[]);
        backwards.expires_at = 10;
        assert!(
            refused(backwards, 5, None)
                .reason
                .contains("before issued_at")
        );
        let mut forever = cmd("reload", &[]);
        forever.expires_at = u64::MAX;
        assert!(
            refused(forever, 1100, None)
                .reason
                .contains("at most 86400s")
        );
    }

    #[test]
    fn signatures_when_required() {
        let a = actions();
        let key: &[u8] = b"secret";
        let r = check(&cmd("reload", &[]), "n", &a, Some(key), 1100).unwrap_err();
        assert!(r.reason.contains("unsigned"));
        let mut c = cmd("reload", &[]);
        c.sign("n", b"other");
        assert!(
            check(&c, "n", &a, Some(key), 1100)
                .unwrap_err()
                .reason
                .contains("bad signature")
        );
        c.sign("other-node", key);
        assert!(check(&c, "n", &a, Some(key), 1100).is_err());
        c.sign("n", key);
        assert!(check(&c, "n", &a, Some(key), 1100).is_ok());
        // Signed but expired: still expired.
        assert_eq!(
            check(&c, "n", &a, Some(key), 2000).unwrap_err().status,
            Outcome::Expired
        );
    }

    #[tokio::test]
    async fn runs_without_a_shell_and_kills_at_the_timeout() {
        let r = run(
            &["/usr/bin/echo".into(), "$(id)".into(), "a;b".into()],
            Duration::from_secs(5),
            "n",
            "1",
        )
        .await;
        assert_eq!(r.status, Outcome::Ok);
        assert_eq!(r.stdout, "$(id) a;b\n", "echoed literally, no shell");
        let r = run(
            &["/usr/bin/sleep".into(), "30".into()],
            Duration::from_millis(200),
            "n",
            "1",
        )
        .await;
        assert_eq!(r.status, Outcome::Failed);
        assert!(r.reason.as_deref().unwrap().contains("timed out"), "{r:?}");
        assert!(r.duration < Duration::from_secs(5));
        let r = run(&["/usr/bin/false".into()], Duration::from_secs(5), "n", "1").await;
        assert_eq!((r.status, r.exit_code), (Outcome::Failed, Some(1)));
        let r = run(&["/nonexistent/x".into()], Duration::from_secs(5), "n", "1").await;
        assert!(r.reason.unwrap().contains("cannot start"));
        let r = run(
            &["/usr/bin/env".into()],
            Duration::from_secs(5),
            "edge-9",
            "id-7",
        )
        .await;
        assert!(
            r.stdout.contains("EDGEFORM_NODE=edge-9")
                && r.stdout.contains("EDGEFORM_COMMAND_ID=id-7")
        );
        assert!(
            !r.stdout.contains("HOME="),
            "environment not inherited: {}",
            r.stdout
        );
    }
}
