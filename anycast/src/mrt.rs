//! Reading route-collector dumps (MRT, RFC 6396) into [`Event`]s: the
//! I/O edge of the anycast audit.
//!
//! Files are RIS `bview` (`TABLE_DUMP_V2` RIBs) or `updates` (`BGP4MP`),
//! plain, gzip or bzip2 (told by their first bytes, not their names).
//! bgpkit-parser frames every record; a RIB record's prefix is read from
//! its first bytes and records for prefixes that are not watched are
//! skipped before their attributes are parsed. That is what keeps a full
//! bview (a million prefixes × hundreds of peers) fast and the memory
//! bounded by the watched prefixes: one record is held at a time.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bgpkit_parser::models::{
    AsPathSegment, Bgp4MpEnum, BgpState, ElemType, EntryType, MrtMessage, TableDumpV2Message,
};
use bgpkit_parser::{BgpElem, Elementor, ParserError, RawMrtRecord, chunk_mrt_record};
use ipnet::IpNet;

use super::{AsPath, Event, Peer, Segment, Watch};

/// How a file is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Bzip2,
}

/// What a file holds, from its first record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `TABLE_DUMP_V2` / `TABLE_DUMP`: a RIB snapshot (bview).
    Rib,
    /// `BGP4MP`: updates.
    Updates,
    /// No records.
    Empty,
}

/// What was read from one file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FileStats {
    pub path: PathBuf,
    pub kind: Kind,
    /// MRT records framed.
    pub records: u64,
    /// Records about a watched prefix (parsed in full).
    pub matched: u64,
    /// Decompressed bytes.
    pub bytes: u64,
}

/// Counts the bytes the parser consumed, for error offsets.
struct Counting<R> {
    inner: R,
    count: u64,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

const BUF: usize = 1 << 20;

/// Open a dump, decompressing by its magic bytes.
///
/// # Errors
/// Unreadable file; a URL; a compression that is not read (zstd, xz).
pub fn open(path: &Path) -> Result<(Box<dyn Read + Send>, Compression)> {
    let text = path.to_string_lossy();
    if text.starts_with("http://") || text.starts_with("https://") {
        bail!("{text}: URLs are not fetched; download the file first (e.g. `curl -O {text}`)");
    }
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut buffered = BufReader::with_capacity(BUF, file);
    let head = buffered
        .fill_buf()
        .with_context(|| format!("reading {}", path.display()))?;
    let compression = if head.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if head.starts_with(b"BZh") {
        Compression::Bzip2
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) || head.starts_with(&[0xfd, b'7', b'z']) {
        bail!(
            "{}: zstd/xz compression is not read; decompress it first, or use the gzip or bzip2 file",
            path.display()
        );
    } else {
        Compression::None
    };
    let reader: Box<dyn Read + Send> = match compression {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(BufReader::with_capacity(
            BUF,
            flate2::bufread::MultiGzDecoder::new(buffered),
        )),
        Compression::Bzip2 => Box::new(BufReader::with_capacity(
            BUF,
            bzip2::bufread::MultiBzDecoder::new(buffered),
        )),
    };
    Ok((reader, compression))
}

/// A compressed file that decompresses to nothing was cut before its
/// first record (the decoders end quietly when the input ends inside the
/// header or first block): an error, never "0 records, nothing flagged".
/// A plain empty file is an empty dump.
fn empty_stream(path: &Path, compression: Compression) -> Result<()> {
    let name = match compression {
        Compression::None => return Ok(()),
        Compression::Gzip => "gzip",
        Compression::Bzip2 => "bzip2",
    };
    bail!(
        "{}: the {name} stream holds no MRT record (truncated before its first record, or empty)",
        path.display()
    )
}

/// Where in a file, for messages.
fn at(path: &Path, offset: u64, compression: Compression) -> String {
    let stream = if compression == Compression::None {
        ""
    } else {
        " of the decompressed stream"
    };
    format!("{}: byte {offset}{stream}", path.display())
}

/// The kind of a file and the time of its first record (microseconds).
///
/// # Errors
/// Unreadable or not MRT.
pub fn peek(path: &Path) -> Result<(Kind, u64)> {
    let (reader, compression) = open(path)?;
    let mut reader = Counting {
        inner: reader,
        count: 0,
    };
    match chunk_mrt_record(&mut reader) {
        Ok(raw) => Ok((kind_of(raw.common_header.entry_type), time_of(&raw))),
        Err(e) if matches!(e.error, ParserError::EofExpected) => {
            empty_stream(path, compression)?;
            Ok((Kind::Empty, 0))
        }
        Err(e) => Err(framing_error(&e.error, &at(path, 0, compression))),
    }
}

fn kind_of(t: EntryType) -> Kind {
    match t {
        EntryType::TABLE_DUMP | EntryType::TABLE_DUMP_V2 => Kind::Rib,
        _ => Kind::Updates,
    }
}

fn time_of(raw: &RawMrtRecord) -> u64 {
    let h = &raw.common_header;
    u64::from(h.timestamp) * 1_000_000 + u64::from(h.microsecond_timestamp.unwrap_or(0))
}

fn framing_error(e: &ParserError, at: &str) -> anyhow::Error {
    match e {
        ParserError::EofError(_) => anyhow::anyhow!("{at}: truncated MRT record"),
        ParserError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            anyhow::anyhow!("{at}: truncated MRT record ({io})")
        }
        ParserError::IoError(io) => anyhow::anyhow!("{at}: {io}"),
        ParserError::OversizedRecord { length } => {
            anyhow::anyhow!("{at}: not an MRT record (declared length {length} bytes)")
        }
        other => anyhow::anyhow!("{at}: unreadable MRT record: {other}"),
    }
}

// TABLE_DUMP_V2 subtypes (RFC 6396 4.3, RFC 8050).
const PEER_INDEX_TABLE: u16 = 1;
const RIB_IPV4_UNICAST: u16 = 2;
const RIB_IPV6_UNICAST: u16 = 4;
const RIB_IPV4_UNICAST_ADDPATH: u16 = 8;
const RIB_IPV6_UNICAST_ADDPATH: u16 = 10;
const RIB_IPV4_MULTICAST: u16 = 3;
const RIB_IPV6_MULTICAST: u16 = 5;
const RIB_IPV4_MULTICAST_ADDPATH: u16 = 9;
const RIB_IPV6_MULTICAST_ADDPATH: u16 = 11;

/// A unicast RIB record's prefix, from its first bytes (sequence number,
/// prefix length, prefix). `None` when malformed: the full parse reports.
fn rib_prefix(body: &[u8], v6: bool) -> Option<IpNet> {
    let len = *body.get(4)?;
    let octets = usize::from(len).div_ceil(8);
    let bytes = body.get(5..5 + octets)?;
    let net = if v6 {
        let mut a = [0u8; 16];
        a.get_mut(..octets)?.copy_from_slice(bytes);
        IpNet::new(IpAddr::V6(Ipv6Addr::from(a)), len).ok()?
    } else {
        let mut a = [0u8; 4];
        a.get_mut(..octets)?.copy_from_slice(bytes);
        IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), len).ok()?
    };
    Some(net.trunc())
}

/// A unicast RIB record's entry count (after the prefix).
fn rib_entry_count(body: &[u8]) -> Option<u16> {
    let len = *body.get(4)?;
    let at = 5 + usize::from(len).div_ceil(8);
    Some(u16::from_be_bytes([*body.get(at)?, *body.get(at + 1)?]))
}

fn segment(s: &AsPathSegment) -> Segment {
    let v = |a: &[bgpkit_parser::models::Asn]| a.iter().map(|x| u32::from(*x)).collect();
    match s {
        AsPathSegment::AsSequence(a) => Segment::Sequence(v(a)),
        AsPathSegment::AsSet(a) => Segment::Set(v(a)),
        AsPathSegment::ConfedSequence(a) => Segment::ConfedSequence(v(a)),
        AsPathSegment::ConfedSet(a) => Segment::ConfedSet(v(a)),
    }
}

fn event(elem: &BgpElem, time: u64) -> Event {
    let peer = Peer {
        ip: elem.peer_ip,
        asn: u32::from(elem.peer_asn),
    };
    let prefix = elem.prefix.prefix.trunc();
    let path_id = elem.prefix.path_id;
    match elem.elem_type {
        ElemType::ANNOUNCE => Event::Announce {
            peer,
            prefix,
            path_id,
            path: AsPath(
                elem.as_path
                    .as_ref()
                    .map(|p| p.segments.iter().map(segment).collect())
                    .unwrap_or_default(),
            ),
            time,
        },
        ElemType::WITHDRAW => Event::Withdraw {
            peer,
            prefix,
            path_id,
            time,
        },
    }
}

/// Read one dump, handing every event about a watched prefix to `sink`,
/// in file order.
///
/// # Errors
/// Unreadable file; a corrupt or truncated record (named by byte offset).
pub fn read(path: &Path, watch: &Watch, sink: &mut dyn FnMut(Event)) -> Result<FileStats> {
    let (reader, compression) = open(path)?;
    let mut reader = Counting {
        inner: reader,
        count: 0,
    };
    let mut stats = FileStats {
        path: path.to_owned(),
        kind: Kind::Empty,
        records: 0,
        matched: 0,
        bytes: 0,
    };
    let mut elementor = Elementor::new();
    let mut peer_table = false;
    loop {
        let offset = reader.count;
        let raw = match chunk_mrt_record(&mut reader) {
            Ok(raw) => raw,
            Err(e) if matches!(e.error, ParserError::EofExpected) => {
                if reader.count == 0 {
                    empty_stream(path, compression)?;
                }
                break;
            }
            Err(e) => return Err(framing_error(&e.error, &at(path, offset, compression))),
        };
        stats.records += 1;
        let header = raw.common_header;
        if stats.kind == Kind::Empty {
            stats.kind = kind_of(header.entry_type);
        }
        let time = time_of(&raw);
        let wanted = match (header.entry_type, header.entry_subtype) {
            (EntryType::TABLE_DUMP_V2, PEER_INDEX_TABLE) => true,
            (EntryType::TABLE_DUMP_V2, RIB_IPV4_UNICAST | RIB_IPV4_UNICAST_ADDPATH) => {
                rib_prefix(&raw.message_bytes, false).is_none_or(|p| watch.covering(&p).is_some())
            }
            (EntryType::TABLE_DUMP_V2, RIB_IPV6_UNICAST | RIB_IPV6_UNICAST_ADDPATH) => {
                rib_prefix(&raw.message_bytes, true).is_none_or(|p| watch.covering(&p).is_some())
            }
            (
                EntryType::TABLE_DUMP_V2,
                RIB_IPV4_MULTICAST
                | RIB_IPV6_MULTICAST
                | RIB_IPV4_MULTICAST_ADDPATH
                | RIB_IPV6_MULTICAST_ADDPATH,
            ) => false,
            (
                EntryType::TABLE_DUMP_V2
                | EntryType::TABLE_DUMP
                | EntryType::BGP4MP
                | EntryType::BGP4MP_ET,
                _,
            ) => true,
            _ => false,
        };
        if !wanted {
            continue;
        }
        let raw_body = raw.message_bytes.clone();
        let record = raw.parse().map_err(|e| {
            anyhow::anyhow!(
                "{}: corrupt MRT record (type {:?}, subtype {}): {e}",
                at(path, offset, compression),
                header.entry_type,
                header.entry_subtype
            )
        })?;
        match &record.message {
            MrtMessage::TableDumpV2Message(TableDumpV2Message::PeerIndexTable(_)) => {
                peer_table = true;
            }
            // bgpkit-parser stops at a damaged entry and keeps the rest
            // quietly; a split computed from part of a prefix's peers
            // would be wrong, so that is an error here.
            MrtMessage::TableDumpV2Message(TableDumpV2Message::RibAfi(rib))
                if rib_entry_count(&raw_body)
                    .is_some_and(|n| usize::from(n) != rib.rib_entries.len()) =>
            {
                bail!(
                    "{}: corrupt MRT record: RIB entries for {} unreadable after {} of {}",
                    at(path, offset, compression),
                    rib.prefix.prefix,
                    rib.rib_entries.len(),
                    rib_entry_count(&raw_body).unwrap_or(0)
                );
            }
            MrtMessage::TableDumpV2Message(_) if !peer_table => bail!(
                "{}: RIB record before the PEER_INDEX_TABLE",
                at(path, offset, compression)
            ),
            MrtMessage::Bgp4Mp(Bgp4MpEnum::StateChange(change)) => {
                if change.new_state != BgpState::Established {
                    sink(Event::PeerDown {
                        peer: Peer {
                            ip: change.peer_ip,
                            asn: u32::from(change.peer_asn),
                        },
                        time,
                    });
                }
                continue;
            }
            _ => {}
        }
        let mut matched = false;
        for elem in elementor.record_to_elems(record) {
            if watch.covering(&elem.prefix.prefix.trunc()).is_some() {
                matched = true;
                sink(event(&elem, time));
            }
        }
        stats.matched += u64::from(matched);
    }
    stats.bytes = reader.count;
    Ok(stats)
}

/// Read several dumps in the documented order: RIB snapshots first, then
/// updates files by the time of their first record (command-line order
/// among equals). Within a file, records apply in file order.
///
/// # Errors
/// See [`read`]; the first failing file stops the run.
pub fn read_all(
    paths: &[PathBuf],
    watch: &Watch,
    sink: &mut dyn FnMut(Event),
) -> Result<Vec<FileStats>> {
    let mut order = Vec::with_capacity(paths.len());
    for (i, p) in paths.iter().enumerate() {
        let (kind, time) = peek(p)?;
        order.push((kind != Kind::Rib, time, i));
    }
    order.sort_unstable();
    order
        .into_iter()
        .map(|(_, _, i)| read(&paths[i], watch, sink))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rib_prefix_reads_the_record_head() {
        // seq 7, /23: three octets, host bits cleared; the rest is entries
        let body = [0, 0, 0, 7, 23, 192, 0, 3, 0xaa];
        assert_eq!(
            rib_prefix(&body, false),
            Some("192.0.2.0/23".parse().unwrap())
        );
        let body = [0, 0, 0, 7, 24, 192, 0, 2];
        assert_eq!(
            rib_prefix(&body, false),
            Some("192.0.2.0/24".parse().unwrap())
        );
        let body = [0, 0, 0, 1, 32, 0x20, 0x01, 0x0d, 0xb8];
        assert_eq!(
            rib_prefix(&body, true),
            Some("2001:db8::/32".parse().unwrap())
        );
        assert_eq!(
            rib_prefix(&[0, 0, 0, 1, 0], false),
            Some("0.0.0.0/0".parse().unwrap())
        );
        // malformed: too long a prefix, or too few bytes
        assert_eq!(rib_prefix(&[0, 0, 0, 1, 33, 1, 2, 3, 4, 5], false), None);
        assert_eq!(rib_prefix(&[0, 0, 0, 1, 24, 1], false), None);
        assert_eq!(rib_prefix(&[0, 0], false), None);
    }
}
