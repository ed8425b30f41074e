//! Wall-clock time for the freeze windows: RFC 3339 parsing
//! (pure) and "now" (the one reader of the clock).
//!
//! The clock is moved only by an explicit `--now TIME` (drills, tests),
//! never from the environment: a moved clock decides which freeze window
//! is open and stamps the history, so every history entry written under
//! it says so (`clock_moved`, with the real time). `EDGEFORM_NOW`, which
//! used to move it silently, is refused.

use std::sync::OnceLock;

/// The variable that used to replace the clock; now refused when set.
pub const NOW_ENV: &str = "EDGEFORM_NOW";

/// The time `--now` set, seconds since the epoch.
static MOVED: OnceLock<u64> = OnceLock::new();

/// Move this process's clock to `secs` (`--now`). The first call wins.
pub fn set_now(secs: u64) {
    let _ = MOVED.set(secs);
}

/// The real time (seconds since the epoch) when `--now` moved the clock.
#[must_use]
pub fn moved() -> Option<u64> {
    MOVED.get().map(|_| system())
}

/// `--now`'s value parser: an RFC 3339 time, or Unix seconds.
///
/// # Errors
/// Anything else.
pub fn parse_flag(text: &str) -> Result<u64, String> {
    let t = text.trim();
    // Unix seconds have 9 digits or more (since 1973): `20261224` is a
    // date written without its dashes, not 1970-08-23.
    let secs = if t.len() >= 9 && t.bytes().all(|b| b.is_ascii_digit()) {
        t.parse().ok()
    } else {
        parse_rfc3339(t)
    };
    secs.ok_or_else(|| {
        format!(
            "`{text}` is not an RFC 3339 time (e.g. 2026-12-24T18:00:00Z) or Unix seconds \
             (9 digits or more)"
        )
    })
}

fn system() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the epoch of an RFC 3339 time with seconds:
/// `2026-12-24T18:00:00Z` or `2026-12-24T19:00:00+01:00` (fractions of a
/// second allowed and dropped). `None` for anything else, including
/// times before 1970.
#[must_use]
pub fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = text.get(r)?;
        if s.bytes().all(|c| c.is_ascii_digit()) {
            s.parse().ok()
        } else {
            None
        }
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut rest = &text[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        rest = &frac[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let rb = rest.as_bytes();
            if rb.len() != 6 || !matches!(rb[0], b'+' | b'-') || rb[3] != b':' {
                return None;
            }
            let oh: i64 = rest[1..3]
                .parse()
                .ok()
                .filter(|_| rest[1..3].bytes().all(|c| c.is_ascii_digit()))?;
            let om: i64 = rest[4..6]
                .parse()
                .ok()
                .filter(|_| rest[4..6].bytes().all(|c| c.is_ascii_digit()))?;
            if oh > 23 || om > 59 {
                return None;
            }
            let sign = if rb[0] == b'-' { -1 } else { 1 };
            sign * (oh * 3600 + om * 60)
        }
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo) || d < 1 || d > days_in[(mo - 1) as usize] {
        return None;
    }
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    // Howard Hinnant's days-from-civil.
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + s.min(59) - offset;
    u64::try_from(secs).ok()
}

/// [`now`] once the CLI checked it: the time `--now` set, otherwise the
/// system clock (never 0, so a freeze window cannot look closed).
#[must_use]
pub fn checked_now() -> u64 {
    MOVED.get().copied().unwrap_or_else(system)
}

/// The instants a freeze window is checked at: [`checked_now`] and, when
/// `--now` moved the clock, the real time as well. A window open at
/// either one is in force, so moving the clock never lifts a freeze
/// (only `--break-glass` does).
#[must_use]
pub fn freeze_instants() -> Vec<u64> {
    let mut at = vec![checked_now()];
    if MOVED.get().is_some() {
        at.push(system());
    }
    at
}

/// Now, in seconds since the epoch: the time `--now` set, otherwise the
/// system clock.
///
/// # Errors
/// `EDGEFORM_NOW` is set: the clock is never moved from the environment
/// (use `--now`, which the history records).
pub fn now() -> anyhow::Result<u64> {
    if std::env::var_os(NOW_ENV).is_some() {
        anyhow::bail!(
            "{NOW_ENV} is set: the clock is not moved from the environment; \
             unset it (or, for a drill, give --now TIME, which the history records)"
        );
    }
    Ok(checked_now())
}

/// RFC 3339 UTC timestamp of now, without a date library.
#[must_use]
pub fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

pub use edgestate::time::{rfc3339, rfc3339_signed};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_takes_rfc3339_or_unix_seconds_and_nothing_else() {
        assert_eq!(parse_flag("2025-12-01T00:00:00Z"), Ok(1_764_547_200));
        assert_eq!(parse_flag("1764547200"), Ok(1_764_547_200));
        assert_eq!(parse_flag(" 100000000 "), Ok(100_000_000));
        for bad in [
            "",
            "0",
            "20261224",
            "tomorrow",
            "-5",
            "1e9",
            "99999999999999999999999",
        ] {
            assert!(parse_flag(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_what_rfc3339_writes_and_offsets() {
        for secs in [0, 951_782_400, 1_795_000_000, 4_102_444_800] {
            assert_eq!(parse_rfc3339(&rfc3339(secs)), Some(secs));
        }
        assert_eq!(
            parse_rfc3339("2026-11-18T12:06:40+01:00"),
            Some(1_795_000_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-18T11:06:40.25Z"),
            Some(1_795_000_000)
        );
        for bad in [
            "2026-11-18",
            "2026-11-18 11:06:40Z",
            "2026-13-01T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "2026-11-18T24:00:00Z",
            "2026-11-18T11:06:40",
            "2026-11-18T11:06:40+1:00",
            "1969-12-31T23:59:59Z",
            "２026-11-18T11:06:40Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
