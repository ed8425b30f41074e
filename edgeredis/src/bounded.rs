//! Replies read from an edge's Redis are bounded before the redis crate
//! buffers them.
//!
//! The redis crate's parser keeps every byte of a reply until the reply is
//! whole, and believes the lengths a server announces: a server that is not
//! Redis (or a compromised one) can send `$20000000000` and then bytes
//! without end, and the reader's memory grows with them until the kernel
//! kills it. [`Scanner`] follows the RESP2/RESP3 framing of the bytes as
//! they arrive, without keeping them, and [`Bounded`] (the stream every
//! connection of this crate reads through) fails the connection as soon as
//! a reply announces or reaches more than [`Limits`] allow. A real Redis
//! holding what edgeform writes never comes near them.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What one reply may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// One string (`$`, `=`, `!`): bytes.
    pub string: u64,
    /// One line (`+`, `-`, `:`, and every length header): bytes, CRLF
    /// included.
    pub line: u64,
    /// One whole reply, every nested value counted: bytes plus
    /// [`VALUE_COST`] per value (what the redis crate holds for it).
    pub reply: u64,
    /// One whole reply: values, aggregates included.
    pub values: u64,
    /// The replies still being read, summed over every [`Bounded`] stream
    /// of this process ([`Limits::reply`]'s measure): several hostile
    /// servers at once cannot add up past it.
    pub process: u64,
}

/// What one value costs the redis crate's parser beyond its bytes (a
/// `redis::Value` and its place in a `Vec`): 16 million `:1` values, 64 MB
/// on the wire, held about 1 GB.
pub const VALUE_COST: u64 = 64;

/// The limits edgeform reads with. A string of 512 MiB is the most a real
/// Redis stores in one value (its `proto-max-bulk-len` default); the largest
/// replies edgeform asks for (an `MGET` of 1,000 documents, a manifest
/// bucket, a format-1 manifest of a million sites) are far below 1 GiB and
/// 4 million values.
pub const LIMITS: Limits = Limits {
    string: 512 << 20,
    line: 1 << 20,
    reply: 1 << 30,
    values: 4 << 20,
    process: 2 << 30,
};

/// The cost of the replies being read now, over every [`Bounded`] stream.
static READING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A refused reply on a node's master connection, with the server that
/// sent it and when: the redis crate reports requests on a connection
/// this crate dropped only as `broken pipe`, and [`crate::with_refusal`]
/// puts the cause back.
type Refusal = (String, Refused, std::time::Instant);

/// The last refusal on each node's master connections.
static REFUSALS: std::sync::Mutex<std::collections::BTreeMap<String, Refusal>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// How long a refusal explains a dropped connection to its node: the
/// requests it fails fail within milliseconds; a drop later than this
/// (a restart, a failover) has another cause. No connect forgets it, so
/// a side connection to the node (another task's) cannot wipe it.
pub const REFUSAL_EXPLAINS: std::time::Duration = std::time::Duration::from_secs(5);

/// The refusal on `node`'s master connections in the last
/// [`REFUSAL_EXPLAINS`]: the server that sent the reply and why it was
/// refused.
#[must_use]
pub fn refused_on(node: &str) -> Option<(String, Refused)> {
    REFUSALS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(node)
        .filter(|(_, _, at)| at.elapsed() < REFUSAL_EXPLAINS)
        .map(|(server, why, _)| (server.clone(), why.clone()))
}

/// Aggregates nested deeper than this are refused (the redis crate's own
/// parser refuses depth over 100).
pub const DEPTH_MAX: usize = 128;

/// How a reply broke [`Limits`] or the framing; the connection is given up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// A string announced over [`Limits::string`] (or a negative length where
    /// none is allowed).
    String(i64),
    /// A line longer than [`Limits::line`].
    Line,
    /// A reply over [`Limits::reply`] bytes.
    Reply,
    /// A reply over [`Limits::values`] values.
    Values,
    /// The replies this process is reading, over every connection, past
    /// [`Limits::process`].
    Process,
    /// Not RESP: an unknown type byte, a length that is not a number, or
    /// aggregates nested deeper than [`DEPTH_MAX`].
    Framing(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let l = LIMITS;
        match self {
            Refused::String(n) => write!(
                f,
                "the server announced a string of {n} bytes (at most {} taken)",
                l.string
            ),
            Refused::Line => write!(f, "the server sent a line over {} bytes", l.line),
            Refused::Reply => write!(
                f,
                "the server's reply is over {} bytes (counting {VALUE_COST} per value)",
                l.reply
            ),
            Refused::Process => write!(
                f,
                "the replies this process is reading are over {} bytes in all",
                l.process
            ),
            Refused::Values => write!(f, "the server's reply holds over {} values", l.values),
            Refused::Framing(what) => write!(f, "the server's reply is not RESP: {what}"),
        }
    }
}

impl std::error::Error for Refused {}

/// Where the scanner is inside the byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before a value's type byte.
    Type,
    /// Inside the line after the type byte `kind`; `cr`: the last byte was
    /// `\r`.
    Line { kind: u8, cr: bool },
    /// Inside a string's bytes and their CRLF: `left` to skip.
    Bytes { left: u64 },
}

/// Follows the RESP framing of a byte stream as it arrives, keeping only
/// the current header line (bounded) and one count per open aggregate.
/// Pure: no I/O.
#[derive(Debug, Clone)]
pub struct Scanner {
    limits: Limits,
    at: At,
    /// The current header line's bytes (without the type byte), kept only
    /// for the types whose line is a length.
    header: Vec<u8>,
    /// The bytes of the current line so far.
    line: u64,
    /// Values still owed to each open aggregate, innermost last.
    open: Vec<u64>,
    /// The current reply's bytes and values so far.
    bytes: u64,
    values: u64,
    /// Whole top-level replies seen.
    replies: u64,
}

impl Scanner {
    #[must_use]
    pub fn new(limits: Limits) -> Scanner {
        Scanner {
            limits,
            at: At::Type,
            header: Vec::new(),
            line: 0,
            open: Vec::new(),
            bytes: 0,
            values: 0,
            replies: 0,
        }
    }

    /// Top-level replies completed so far.
    #[must_use]
    pub fn replies(&self) -> u64 {
        self.replies
    }

    /// What the reply being read costs so far ([`Limits::reply`]'s
    /// measure); 0 between replies.
    #[must_use]
    pub fn held(&self) -> u64 {
        self.bytes
    }

    /// Take the next bytes of the stream.
    ///
    /// # Errors
    /// A reply over the limits, or bytes that are not RESP; the scanner is
    /// then of no further use.
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), Refused> {
        while !data.is_empty() {
            match self.at {
                At::Bytes { left } => {
                    let n = left.min(data.len() as u64);
                    self.count(n)?;
                    data = &data[usize::try_from(n).unwrap_or(data.len())..];
                    if n == left {
                        self.at = At::Type;
                        self.done();
                    } else {
                        self.at = At::Bytes { left: left - n };
                    }
                }
                At::Type => {
                    let kind = data[0];
                    data = &data[1..];
                    self.count(1 + VALUE_COST)?;
                    self.values += 1;
                    if self.values > self.limits.values {
                        return Err(Refused::Values);
                    }
                    if !b"+-:,#_($=!*~%|>".contains(&kind) {
                        return Err(Refused::Framing(format!("unknown type byte 0x{kind:02x}")));
                    }
                    self.header.clear();
                    self.line = 1;
                    self.at = At::Line { kind, cr: false };
                }
                At::Line { kind, cr } => {
                    // Up to the end of the line, or of the data.
                    let end = data.iter().position(|&b| b == b'\n');
                    let take = end.map_or(data.len(), |i| i + 1);
                    let chunk = &data[..take];
                    data = &data[take..];
                    self.count(take as u64)?;
                    self.line += take as u64;
                    if self.line > self.limits.line {
                        return Err(Refused::Line);
                    }
                    let ends = match end {
                        // "\r\n" ends the line; a "\n" alone is part of it.
                        Some(0) => cr,
                        Some(i) => chunk[i - 1] == b'\r',
                        None => false,
                    };
                    if Self::is_length(kind) {
                        self.header.extend_from_slice(chunk);
                    }
                    if ends {
                        self.header_done(kind)?;
                    } else {
                        self.at = At::Line {
                            kind,
                            cr: chunk.last() == Some(&b'\r'),
                        };
                    }
                }
            }
        }
        Ok(())
    }

    /// The types whose line is a length or count.
    fn is_length(kind: u8) -> bool {
        b"$=!*~%|>".contains(&kind)
    }

    fn count(&mut self, n: u64) -> Result<(), Refused> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes > self.limits.reply {
            return Err(Refused::Reply);
        }
        Ok(())
    }

    /// A header line ended (its CRLF taken).
    fn header_done(&mut self, kind: u8) -> Result<(), Refused> {
        self.at = At::Type;
        if !Self::is_length(kind) {
            self.done();
            return Ok(());
        }
        // As the redis crate reads it: the line without its CRLF, trimmed,
        // as an i64.
        let line = &self.header[..self.header.len().saturating_sub(2)];
        let n = std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| {
                Refused::Framing(format!(
                    "a `{}` length that is not a number",
                    char::from(kind)
                ))
            })?;
        self.header.clear();
        match kind {
            b'$' | b'=' | b'!' => {
                if n < 0 && kind == b'$' {
                    // Null string.
                    self.done();
                    return Ok(());
                }
                let len = u64::try_from(n).map_err(|_| Refused::String(n))?;
                if len > self.limits.string {
                    return Err(Refused::String(n));
                }
                // Refused before the bytes come when they cannot fit.
                if self.bytes.saturating_add(len + 2) > self.limits.reply {
                    return Err(Refused::Reply);
                }
                self.at = At::Bytes { left: len + 2 };
            }
            _ => {
                // Aggregates: a map's and an attribute's count is of pairs;
                // an attribute is followed by the value it annotates.
                if n < 0 && matches!(kind, b'*' | b'~') || n <= 0 && kind == b'>' {
                    self.done();
                    return Ok(());
                }
                let n = u64::try_from(n).map_err(|_| {
                    Refused::Framing(format!("a negative `{}` count", char::from(kind)))
                })?;
                let owed = match kind {
                    b'%' => n.checked_mul(2),
                    b'|' => n.checked_mul(2).and_then(|n| n.checked_add(1)),
                    _ => Some(n),
                }
                .ok_or(Refused::Values)?;
                if self.values.saturating_add(owed) > self.limits.values {
                    return Err(Refused::Values);
                }
                if self
                    .bytes
                    .saturating_add(owed.saturating_mul(3 + VALUE_COST))
                    > self.limits.reply
                {
                    return Err(Refused::Reply);
                }
                if owed == 0 {
                    self.done();
                } else if self.open.len() >= DEPTH_MAX {
                    return Err(Refused::Framing(format!(
                        "aggregates nested deeper than {DEPTH_MAX}"
                    )));
                } else {
                    self.open.push(owed);
                }
            }
        }
        Ok(())
    }

    /// A value is whole: it counts toward its aggregate, which may be whole
    /// in turn; a top-level value ends the reply.
    fn done(&mut self) {
        loop {
            match self.open.last_mut() {
                None => {
                    self.replies += 1;
                    self.bytes = 0;
                    self.values = 0;
                    return;
                }
                Some(owed) => {
                    *owed -= 1;
                    if *owed > 0 {
                        return;
                    }
                    self.open.pop();
                }
            }
        }
    }
}

/// A stream whose incoming bytes pass a [`Scanner`]: a read that would
/// break the limits fails with [`io::ErrorKind::InvalidData`], its cause a
/// [`Refused`].
///
/// What its unfinished reply costs is counted in a process-wide sum
/// ([`Limits::process`]). A refusal is also logged as a warning naming the
/// server: the redis crate reports a failed pipeline as a closed
/// connection, without this cause.
pub struct Bounded<S> {
    inner: S,
    scanner: Scanner,
    /// Whom it reads from, for the warning.
    server: String,
    /// The node it serves, whose refusal is kept for [`refused_on`].
    node: Option<String>,
    /// This stream's share of [`READING`].
    counted: u64,
    /// Why it was refused: every later read fails the same way.
    refused: Option<Refused>,
}

impl<S> Bounded<S> {
    pub fn new(inner: S, limits: Limits, server: String) -> Bounded<S> {
        Bounded {
            inner,
            scanner: Scanner::new(limits),
            server,
            node: None,
            counted: 0,
            refused: None,
        }
    }

    /// Keep a refusal of this stream as `node`'s (see [`refused_on`]): a
    /// master connection's. A Sentinel's refused reply fails its
    /// `SENTINEL MASTER` with the cause already in the error.
    #[must_use]
    pub fn for_node(mut self, node: Option<&str>) -> Bounded<S> {
        self.node = node.map(str::to_owned);
        self
    }

    /// Bring this stream's share of the process-wide sum to what its
    /// scanner holds now.
    fn account(&mut self) -> Result<(), Refused> {
        use std::sync::atomic::Ordering::Relaxed;
        let held = self.scanner.held();
        if held >= self.counted {
            let more = held - self.counted;
            let total = READING.fetch_add(more, Relaxed) + more;
            self.counted = held;
            if total > self.scanner.limits.process {
                return Err(Refused::Process);
            }
        } else {
            READING.fetch_sub(self.counted - held, Relaxed);
            self.counted = held;
        }
        Ok(())
    }
}

impl<S> Drop for Bounded<S> {
    fn drop(&mut self) {
        READING.fetch_sub(self.counted, std::sync::atomic::Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        if let Some(why) = &this.refused {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why.clone())));
        }
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let fresh = &buf.filled()[before..];
                match this.scanner.feed(fresh).and_then(|()| this.account()) {
                    Ok(()) => Poll::Ready(Ok(())),
                    Err(why) => {
                        buf.set_filled(before);
                        // Nothing more is read: its share is free.
                        READING.fetch_sub(this.counted, std::sync::atomic::Ordering::Relaxed);
                        this.counted = 0;
                        this.refused = Some(why.clone());
                        tracing::warn!(server = %this.server, cause = %why, "redis: reply refused, connection dropped");
                        if let Some(node) = &this.node {
                            REFUSALS
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .insert(
                                    node.clone(),
                                    (this.server.clone(), why.clone(), std::time::Instant::now()),
                                );
                        }
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, why)))
                    }
                }
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests;
