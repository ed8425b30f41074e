//! The agent's own durable record of the commands it took to run: the
//! bound on replay that does not depend on the node's Redis.
//!
//! The id claimed in Redis (`edgeform:cmd:<id>`) is what answers a
//! redelivery with the first run's result; but Redis can lose it (a
//! `FLUSHALL`, a restore, a failover to a replica that never saw it), and
//! then a replayed signed command would run again while it has not
//! expired. So before an action starts, its id and how long to keep it
//! (the command's `expires_at` plus [`MARGIN_SECS`]) are appended to
//! `<state_dir>/commands` and fsync'd; an id found there never runs
//! again, whatever Redis says. Past `expires_at` the command is refused as
//! expired anyway, so the record forgets it then and stays small.
//!
//! Losing the file itself must not reopen the window: the file's first
//! line holds when the record began (`created_at`), and a command issued
//! before that is refused — whether it ran before the record was lost
//! cannot be proven. A new record (first start, a wiped state dir, a
//! corrupt file, which is moved aside) therefore refuses every command
//! issued earlier, once; they can be sent again.
//!
//! Format (text, one entry a line, appended):
//! ```text
//! edgeform-agent commands 1 <created_at>
//! <keep_until> <id>
//! ```
//! Ids are topic levels: no newline or other control character. A last
//! line without its newline is a write cut by a crash before the fsync
//! returned (so before the action started): ignored. The file is
//! rewritten (temporary file, fsync, rename, fsync of the folder) at open
//! and when forgotten entries outnumber the kept ones.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// How long an id is kept past its command's `expires_at`: a clock set
/// back by up to this much still finds it.
pub const MARGIN_SECS: u64 = 3600;

/// The file's name in the state dir.
pub const FILE: &str = "commands";

const HEADER: &str = "edgeform-agent commands 1";

/// id → keep until (Unix seconds); ordered, so the file is written the
/// same way every time.
type Entries = BTreeMap<String, u64>;

/// The largest record read at open (≈ 1.3M entries); a bigger one is
/// treated as corrupt: moved aside, a new record begun.
const MAX_BYTES: u64 = 64 << 20;

/// What the record says about a command about to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not seen: now recorded (durably); it may run.
    Recorded,
    /// Taken before: never again.
    Taken,
    /// Issued before the record began (the `u64`): not provably new.
    Before(u64),
}

/// The open record.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    /// Appends go here; each is fsync'd before the action starts.
    file: std::fs::File,
    /// When this record began (Unix seconds).
    created_at: u64,
    /// id → keep until (Unix seconds).
    kept: Entries,
    /// Entry lines in the file (kept or forgotten), to know when to
    /// rewrite it.
    lines: usize,
    /// At this many lines, forget what is past its time and rewrite the
    /// file if that is most of it (amortised: O(1) a command).
    next_look: usize,
}

/// Lines appended at least between two looks at forgotten entries.
const LOOK_EVERY: usize = 1024;

/// What opening found, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opened {
    /// An existing record, with its entries still kept.
    Existing { kept: usize },
    /// No record yet: begun now.
    New,
    /// The file was unreadable as a record: moved to the path given, a
    /// new record begun.
    Corrupt { moved_to: PathBuf, why: String },
}

impl Ledger {
    /// Open (or begin) the record in `dir`, creating `dir` (0700) if
    /// needed; forget entries past their time.
    ///
    /// # Errors
    /// The folder or file cannot be created, read or written.
    pub fn open(dir: &Path, now: u64) -> std::io::Result<(Ledger, Opened)> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let path = dir.join(FILE);
        let (created_at, kept, opened) = match read(&path) {
            Ok(None) => (now, Entries::new(), Opened::New),
            Ok(Some((created_at, mut kept))) => {
                kept.retain(|_, until| *until >= now);
                let n = kept.len();
                (created_at, kept, Opened::Existing { kept: n })
            }
            Err(Unreadable::Io(e)) => return Err(e),
            Err(Unreadable::Corrupt(why)) => {
                let moved_to = dir.join(format!("{FILE}.corrupt-{now}"));
                std::fs::rename(&path, &moved_to)?;
                (now, Entries::new(), Opened::Corrupt { moved_to, why })
            }
        };
        rewrite(&path, created_at, &kept)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path)?;
        let lines = kept.len();
        Ok((
            Ledger {
                path,
                file,
                created_at,
                kept,
                lines,
                next_look: lines + LOOK_EVERY.max(lines),
            },
            opened,
        ))
    }

    /// When this record began.
    #[must_use]
    pub fn created_at(&self) -> u64 {
        self.created_at
    }

    /// Decide about a command `id` issued at `issued_at` that would run
    /// now, and record it (fsync'd) when it may: keep it until
    /// `keep_until`.
    ///
    /// # Errors
    /// The entry cannot be written durably: the command must not run.
    pub fn take(
        &mut self,
        id: &str,
        issued_at: u64,
        keep_until: u64,
        now: u64,
    ) -> std::io::Result<Verdict> {
        if self.kept.get(id).is_some_and(|until| *until >= now) {
            return Ok(Verdict::Taken);
        }
        if issued_at < self.created_at {
            return Ok(Verdict::Before(self.created_at));
        }
        debug_assert!(!id.contains(['\n', '\r']));
        self.file
            .write_all(format!("{keep_until} {id}\n").as_bytes())?;
        self.file.sync_data()?;
        self.kept.insert(id.to_owned(), keep_until);
        self.lines += 1;
        if self.lines >= self.next_look {
            self.kept.retain(|_, until| *until >= now);
            if self.lines > 2 * self.kept.len() {
                rewrite(&self.path, self.created_at, &self.kept)?;
                self.file = std::fs::OpenOptions::new().append(true).open(&self.path)?;
                self.lines = self.kept.len();
            }
            self.next_look = self.lines + LOOK_EVERY.max(self.kept.len());
        }
        Ok(Verdict::Recorded)
    }
}

enum Unreadable {
    Io(std::io::Error),
    Corrupt(String),
}

/// `None`: no file. Otherwise `created_at` and every entry (the newest
/// time per id).
fn read(path: &Path) -> Result<Option<(u64, Entries)>, Unreadable> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Unreadable::Io(e)),
    };
    if !meta.file_type().is_file() {
        return Err(Unreadable::Corrupt("not a regular file".into()));
    }
    if meta.len() > MAX_BYTES {
        return Err(Unreadable::Corrupt(format!(
            "{} bytes, more than {MAX_BYTES}",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(Unreadable::Io)?;
    parse(&bytes).map(Some).map_err(Unreadable::Corrupt)
}

/// The record's text → `created_at` and the entries. Pure.
fn parse(bytes: &[u8]) -> Result<(u64, Entries), String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    // A last line without its newline was cut by a crash: never fsync'd,
    // so its command never started.
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    let mut lines = complete.lines();
    let created_at = lines
        .next()
        .and_then(|h| h.strip_prefix(HEADER))
        .and_then(|rest| rest.strip_prefix(' '))
        .and_then(|t| t.parse::<u64>().ok())
        .ok_or_else(|| format!("the first line is not `{HEADER} <created_at>`"))?;
    let mut kept = Entries::new();
    for (i, line) in lines.enumerate() {
        let entry = line.split_once(' ').and_then(|(until, id)| {
            let until = until.parse::<u64>().ok()?;
            edgestate::mqtt::is_topic_level(id).then_some((id, until))
        });
        let Some((id, until)) = entry else {
            return Err(format!("line {} is not `<keep_until> <id>`", i + 2));
        };
        let e = kept.entry(id.to_owned()).or_insert(until);
        *e = (*e).max(until);
    }
    Ok((created_at, kept))
}

/// Write the whole record anew, atomically and durably.
fn rewrite(path: &Path, created_at: u64, kept: &Entries) -> std::io::Result<()> {
    let mut text = format!("{HEADER} {created_at}\n");
    for (id, until) in kept {
        text.push_str(&format!("{until} {id}\n"));
    }
    let tmp = path.with_extension("tmp");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_taken_once_is_never_taken_again_until_it_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (mut l, opened) = Ledger::open(&state, 1000).unwrap();
        assert_eq!(opened, Opened::New);
        assert_eq!(l.created_at(), 1000);
        assert_eq!(l.take("a", 1000, 2000, 1001).unwrap(), Verdict::Recorded);
        assert_eq!(l.take("a", 1000, 2000, 1002).unwrap(), Verdict::Taken);
        // Issued before the record began: not provably new.
        assert_eq!(
            l.take("old", 999, 2000, 1002).unwrap(),
            Verdict::Before(1000)
        );
        drop(l);
        // Reopened (a restart): still taken; the beginning is kept.
        let (mut l, opened) = Ledger::open(&state, 1500).unwrap();
        assert_eq!(opened, Opened::Existing { kept: 1 });
        assert_eq!(l.created_at(), 1000);
        assert_eq!(l.take("a", 1000, 2000, 1500).unwrap(), Verdict::Taken);
        drop(l);
        // Past its time (the command is expired by then): forgotten.
        let (_, opened) = Ledger::open(&state, 2001).unwrap();
        assert_eq!(opened, Opened::Existing { kept: 0 });
        let mode = std::fs::metadata(&state).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
    }

    #[test]
    fn a_cut_last_line_is_ignored_and_garbage_begins_a_new_record() {
        assert_eq!(
            parse(b"edgeform-agent commands 1 5\n9 a\n9 b").unwrap(),
            (5, Entries::from([("a".to_owned(), 9)]))
        );
        for bad in [
            &b""[..],
            b"something else 5\n",
            b"edgeform-agent commands 1 5\nnine a\n",
            b"edgeform-agent commands 1 5\n9 a/b\n",
            b"edgeform-agent commands 1 5\n\xff\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), "garbage\n").unwrap();
        let (mut l, opened) = Ledger::open(dir.path(), 700).unwrap();
        assert!(matches!(opened, Opened::Corrupt { .. }), "{opened:?}");
        assert!(dir.path().join("commands.corrupt-700").exists());
        // A new record: whatever was issued before it is refused.
        assert_eq!(l.take("x", 699, 800, 701).unwrap(), Verdict::Before(700));
    }

    #[test]
    fn the_file_is_rewritten_when_forgotten_entries_pile_up() {
        // 3,000 fsyncs: on tmpfs where there is one, they cost nothing.
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let (mut l, _) = Ledger::open(dir.path(), 10).unwrap();
        for i in 0..3000 {
            // Each kept for 5 seconds; "now" moves a second a command.
            let now = 10 + i;
            l.take(&format!("c{i}"), now, now + 5, now).unwrap();
        }
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert!(text.lines().count() <= 1030, "{}", text.lines().count());
        assert_eq!(l.take("c2999", 3009, 3014, 3010).unwrap(), Verdict::Taken);
    }
}
