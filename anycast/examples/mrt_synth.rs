//! Writes a synthetic RIS-like bview (MRT TABLE_DUMP_V2) for the anycast
//! benchmark: `PREFIXES` prefixes (four in five IPv4 /24s, one in five
//! IPv6 /48s) × `PEERS` collector peers, realistic attributes (ORIGIN,
//! AS_PATH of 2–7 four-byte ASes, NEXT_HOP or MP_REACH, two communities),
//! plus the example repository's three anycast prefixes with a known
//! split. Writes plain MRT to FILE (gzip it for the compressed run).
//!
//! `cargo run --release -p anycast --example mrt_synth -- FILE PREFIXES PEERS`

use std::io::{BufWriter, Write};

const TIME: u32 = 1_700_000_000;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u32 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

fn header(out: &mut impl Write, subtype: u16, len: usize) -> std::io::Result<()> {
    out.write_all(&TIME.to_be_bytes())?;
    out.write_all(&13u16.to_be_bytes())?;
    out.write_all(&subtype.to_be_bytes())?;
    out.write_all(&u32::try_from(len).expect("record fits").to_be_bytes())
}

fn attr(buf: &mut Vec<u8>, flags: u8, kind: u8, value: &[u8]) {
    if value.len() > 255 {
        buf.extend_from_slice(&[flags | 0x10, kind]);
        buf.extend_from_slice(&u16::try_from(value.len()).expect("attr").to_be_bytes());
    } else {
        buf.extend_from_slice(&[flags, kind, u8::try_from(value.len()).expect("attr")]);
    }
    buf.extend_from_slice(value);
}

/// One RIB entry's attributes for `path`.
fn attributes(buf: &mut Vec<u8>, path: &[u32], v6: bool, peer: u16, rng: &mut Rng) {
    attr(buf, 0x40, 1, &[0]);
    let mut seg = vec![2, u8::try_from(path.len()).expect("path")];
    for a in path {
        seg.extend_from_slice(&a.to_be_bytes());
    }
    attr(buf, 0x40, 2, &seg);
    let [hi, lo] = peer.to_be_bytes();
    if v6 {
        let mut nh = vec![16, 0x20, 0x01, 0x0d, 0xb8, 0xff, 0xff];
        nh.extend_from_slice(&[0; 8]);
        nh.extend_from_slice(&[hi, lo]);
        attr(buf, 0x80, 14, &nh);
    } else {
        attr(buf, 0x40, 3, &[10, 0, hi, lo]);
    }
    let mut comm = Vec::new();
    for _ in 0..2 {
        comm.extend_from_slice(&(path[0] as u16).to_be_bytes());
        comm.extend_from_slice(&((rng.next() % 1000) as u16).to_be_bytes());
    }
    attr(buf, 0xc0, 8, &comm);
}

fn rib_record(
    out: &mut impl Write,
    seq: u32,
    prefix: &[u8],
    len: u8,
    v6: bool,
    paths: &[(u16, Vec<u32>)],
    rng: &mut Rng,
) -> std::io::Result<()> {
    let mut body = Vec::with_capacity(64 * paths.len());
    body.extend_from_slice(&seq.to_be_bytes());
    body.push(len);
    body.extend_from_slice(&prefix[..usize::from(len).div_ceil(8)]);
    body.extend_from_slice(&u16::try_from(paths.len()).expect("peers").to_be_bytes());
    let mut attrs = Vec::with_capacity(64);
    for (peer, path) in paths {
        attrs.clear();
        attributes(&mut attrs, path, v6, *peer, rng);
        body.extend_from_slice(&peer.to_be_bytes());
        body.extend_from_slice(&(TIME - 3600).to_be_bytes());
        body.extend_from_slice(&u16::try_from(attrs.len()).expect("attrs").to_be_bytes());
        body.extend_from_slice(&attrs);
    }
    header(out, if v6 { 4 } else { 2 }, body.len())?;
    out.write_all(&body)
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: mrt_synth FILE PREFIXES PEERS";
    let file = args.get(1).expect(usage);
    let prefixes: u32 = args.get(2).and_then(|s| s.parse().ok()).expect(usage);
    let peers: u16 = args.get(3).and_then(|s| s.parse().ok()).expect(usage);
    let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(file)?);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);

    // PEER_INDEX_TABLE: IPv4 peers with four-byte ASNs.
    let mut pit = Vec::new();
    pit.extend_from_slice(&[192, 0, 2, 254]);
    pit.extend_from_slice(&4u16.to_be_bytes());
    pit.extend_from_slice(b"synt");
    pit.extend_from_slice(&peers.to_be_bytes());
    for p in 0..peers {
        let [hi, lo] = p.to_be_bytes();
        pit.push(0x02);
        pit.extend_from_slice(&[10, 0, hi, lo]);
        pit.extend_from_slice(&[10, 0, hi, lo]);
        pit.extend_from_slice(&(65000 + u32::from(p)).to_be_bytes());
    }
    header(&mut out, 1, pit.len())?;
    out.write_all(&pit)?;

    let transit = [174u32, 1299, 2914, 3257, 3356, 6453, 6762, 6939, 7018];
    let mut seq = 0;
    let random_paths = |rng: &mut Rng| -> Vec<(u16, Vec<u32>)> {
        (0..peers)
            .map(|p| {
                let n = 2 + rng.next() % 6;
                let mut path = vec![65000 + u32::from(p)];
                for _ in 1..n {
                    path.push(transit[(rng.next() as usize) % transit.len()]);
                }
                path.push(1 + rng.next() % 200_000);
                (p, path)
            })
            .collect()
    };
    let (mut v4, mut v6) = (0u32, 0u32);
    for i in 0..prefixes {
        let paths = random_paths(&mut rng);
        if i % 5 == 4 {
            // 2a00:xxxx:xx00::/48
            let [a, b, c, _] = v6.to_be_bytes();
            let p = [0x2a, 0x00, a, b, c, 0];
            rib_record(&mut out, seq, &p, 48, true, &paths, &mut rng)?;
            v6 += 1;
        } else {
            // from 1.0.0.0/24 upwards
            let p = (0x0100_0000 + (v4 << 8)).to_be_bytes();
            rib_record(&mut out, seq, &p, 24, false, &paths, &mut rng)?;
            v4 += 1;
        }
        seq += 1;
    }
    // The example repository's anycast prefixes: dns 85 % through
    // transit-a (AS64500); data-a only through transit-a; data-b split
    // evenly, transit-b (AS64501) two hops longer (a reseller).
    let ours: [(&[u8], u8, bool); 3] = [
        (&[192, 0, 2, 0], 24, false),
        (&[198, 51, 100, 0], 24, false),
        (&[0x20, 0x01, 0x0d, 0xb8], 32, true),
    ];
    for (k, (prefix, len, is6)) in ours.into_iter().enumerate() {
        let paths: Vec<(u16, Vec<u32>)> = (0..peers)
            .map(|p| {
                let me = 65000 + u32::from(p);
                let path = match k {
                    0 if u32::from(p) * 100 < u32::from(peers) * 85 => vec![me, 3356, 64500, 64496],
                    0 => vec![me, 3356, 64501, 64496],
                    1 => vec![me, 64500, 64496],
                    _ if p % 2 == 0 => vec![me, 64500, 64496],
                    _ => vec![me, 6939, 64510, 64501, 64496],
                };
                (p, path)
            })
            .collect();
        rib_record(&mut out, seq, prefix, len, is6, &paths, &mut rng)?;
        seq += 1;
    }
    out.flush()
}
