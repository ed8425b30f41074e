//! The audit trail: who moved a target where. Every write
//! transaction (apply, sync, heal) records `applied_by` (user@host),
//! `forced` and the command in `edgeform:meta`, and pushes one
//! [`Entry`] onto the target's capped `edgeform:history` list — in the
//! same MULTI/EXEC as the documents, so the history never disagrees with
//! what was written.

use edgestate::keys;
use serde::{Deserialize, Serialize};

/// Entries kept per target (newest first).
pub const HISTORY_CAP: usize = 100;

/// Who runs this process and how, recorded with every write.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// `user@host`.
    pub applied_by: String,
    /// The command line (without the program's path).
    pub command: String,
    /// When the run started, seconds since the epoch (the injectable
    /// clock, [`compiler::clock::now`]).
    pub now: u64,
    /// The real time when `--now` moved the clock (`now` is then not it).
    pub moved: Option<u64>,
    /// A certificate renewal pushed inside an open freeze window because
    /// a certificate would otherwise expire within 72 hours: recorded in
    /// the entry (`freeze`, `urgent_renewal`).
    pub urgent_renewal: Option<UrgentRenewal>,
    /// The rollout wave this write moves targets in (`apply.waves`):
    /// recorded in the meta (`wave`) and the entry.
    pub wave: Option<String>,
    /// Why the rollback guard let this write move a target back, when a
    /// rollout did it (e.g. `rollback by rollout abort`): in the entry.
    pub consent: Option<String>,
}

/// Why a renewal went through an open freeze window: the window and, in
/// words, the certificates that would otherwise expire within 72 hours
/// (`<host> expires <RFC 3339>`, comma-separated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UrgentRenewal {
    pub window: String,
    pub hosts: String,
}

impl Audit {
    /// This process: `$USER` (or `uid<N>`) at the kernel's hostname, its
    /// arguments, and `now`.
    #[must_use]
    pub fn current(now: u64) -> Audit {
        let user = std::env::var("USER")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(uid);
        Audit {
            applied_by: format!("{user}@{}", super::lock::hostname()),
            command: command_line(std::env::args().skip(1)),
            now,
            moved: compiler::clock::moved(),
            urgent_renewal: None,
            wave: None,
            consent: None,
        }
    }
}

fn uid() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next().map(|u| format!("uid{u}")))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// `edgeform` and its arguments as one line: arguments with spaces or
/// quotes are quoted, control characters escaped; at most 512 bytes.
#[must_use]
pub fn command_line(args: impl Iterator<Item = String>) -> String {
    let mut out = String::from("edgeform");
    for a in args {
        out.push(' ');
        let a = edgestate::untrusted::escape(&a);
        if a.is_empty() || a.contains([' ', '"', '\'']) {
            out.push_str(&format!("{a:?}"));
        } else {
            out.push_str(&a);
        }
    }
    if out.len() > 512 {
        let mut cut = 509;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}

/// One write to a target, as kept in `edgeform:history` (JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// When (RFC 3339, UTC).
    pub at: String,
    /// `apply`, `sync`, `heal` or `renew`.
    pub action: String,
    pub commit: String,
    /// The commit the target had before (`None`: none).
    pub previous_commit: Option<String>,
    pub generation: u64,
    pub applied_by: String,
    pub command: String,
    /// `--force` was given.
    pub forced: bool,
    /// `--break-glass` was given.
    pub break_glass: bool,
    /// The freeze window that was open and broken (`--break-glass`, or a
    /// renewal of a certificate expiring within 72 hours).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<String>,
    /// A renewal pushed inside the freeze window `freeze`: the
    /// certificates that would otherwise have expired within 72 hours
    /// (`<host> expires <RFC 3339>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urgent_renewal: Option<String>,
    /// Documents written (added or changed), and deleted.
    pub written: usize,
    pub deleted: usize,
    /// Of `written`, those added and those changed (entries written before
    /// they were recorded have neither).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<usize>,
    /// `apply --adopt` took over a target whose live commit (this) was not
    /// in the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted: Option<String>,
    /// `--now` moved the clock (a drill or a test): `at` is the moved
    /// time, this the real one (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_moved: Option<String>,
    /// The rollout wave the write belongs to (`apply.waves`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<String>,
    /// The rollback guard's consent given by a rollout (`rollback by
    /// rollout abort`), in place of `--allow-rollback` on the command line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consent: Option<String>,
}

/// Append to `pipe` (inside MULTI) the entry and the trim to
/// [`HISTORY_CAP`].
pub fn record(pipe: &mut redis::Pipeline, entry: &Entry) {
    let json = serde_json::to_string(entry).unwrap_or_default();
    pipe.cmd("LPUSH").arg(keys::HISTORY).arg(json);
    pipe.cmd("LTRIM")
        .arg(keys::HISTORY)
        .arg(0)
        .arg(HISTORY_CAP - 1);
}

/// The meta fields of the audit: `applied_by`, `forced`, `command`, and
/// `wave` when the write is a rollout's.
pub fn meta_fields(cmd: &mut redis::Cmd, entry: &Entry) {
    cmd.arg("applied_by")
        .arg(&entry.applied_by)
        .arg("forced")
        .arg(if entry.forced { "true" } else { "false" })
        .arg("command")
        .arg(&entry.command);
    if let Some(wave) = &entry.wave {
        cmd.arg("wave").arg(wave);
    }
}

/// Whether a write of `entry` leaves an older `wave` field of the meta
/// stale: a move (apply, sync) outside any rollout. Repairs keep it.
#[must_use]
pub fn clears_wave(entry: &Entry) -> bool {
    entry.wave.is_none() && matches!(entry.action.as_str(), "apply" | "sync")
}

/// A target's history as read (`LRANGE 0 -1`), newest first; entries that
/// are not ours are kept as their text.
#[must_use]
pub fn parse_history(raw: &[Vec<u8>]) -> Vec<Result<Entry, String>> {
    raw.iter()
        .map(|b| serde_json::from_slice(b).map_err(|_| edgestate::untrusted::preview(b, 200)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_one_quoted_line() {
        let args = ["apply", "--yes", "a b", "x\ny"].map(String::from);
        assert_eq!(
            command_line(args.into_iter()),
            r#"edgeform apply --yes "a b" x\ny"#
        );
        let long = command_line(std::iter::once("é".repeat(400)));
        assert!(long.len() <= 512 && long.ends_with("..."));
    }

    #[test]
    fn entries_without_the_renewal_fields_still_parse_and_new_ones_carry_them() {
        let old = br#"{"at":"2026-12-01T00:00:00Z","action":"sync","commit":"b","previous_commit":"a","generation":2,"applied_by":"u@h","command":"edgeform reconcile","forced":false,"break_glass":false,"written":1,"deleted":0}"#;
        let parsed = parse_history(&[old.to_vec()]);
        let e = parsed[0].as_ref().unwrap();
        assert_eq!(
            (e.freeze.as_deref(), e.urgent_renewal.as_deref()),
            (None, None)
        );
        // Written back without the fields it does not have.
        let json = serde_json::to_string(e).unwrap();
        assert!(!json.contains("urgent_renewal") && !json.contains("freeze"));
        let mut renewed = e.clone();
        renewed.action = "renew".into();
        renewed.freeze = Some("final".into());
        renewed.urgent_renewal = Some("shop.test expires 2026-12-03T00:00:00Z".into());
        let json = serde_json::to_string(&renewed).unwrap();
        let back = parse_history(&[json.into_bytes()]);
        assert_eq!(back[0].as_ref().unwrap(), &renewed);
    }
}
