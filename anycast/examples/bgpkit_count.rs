//! The benchmark's reference: bgpkit-parser's own way of reading a dump,
//! as in its `count_elems` example (`BgpkitParser` → iterate every
//! `BgpElem`), on a local file decompressed by the same reader
//! `edgeform anycast` uses. Prints the elem count.
//!
//! `cargo run --release -p anycast --example bgpkit_count -- FILE`

use bgpkit_parser::BgpkitParser;

fn main() -> anyhow::Result<()> {
    let path = std::env::args().nth(1).expect("usage: bgpkit_count FILE");
    let (reader, _) = anycast::mrt::open(std::path::Path::new(&path))?;
    let count = BgpkitParser::from_reader(reader).into_iter().count();
    println!("{count}");
    Ok(())
}
