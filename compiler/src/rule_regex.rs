//! The regex dialect a rule (`cache_rules`/`edge_rules`, `match_type:
//! regex`) may use. Pure.
//!
//! Rules run on the edge in nginx + Lua (`ngx.re`: the Lua module links
//! PCRE1, `libpcre.so.3`, used without its UTF mode, a backtracking engine
//! over bytes); `explain` (`edgestate::edge`) runs them with Rust's
//! `regex::bytes` with Unicode off. A rule is accepted only in the
//! intersection both read identically, and when it cannot make PCRE
//! backtrack badly:
//! - ASCII text only (a byte above 0x7f is written `\xHH`); no Unicode
//!   classes (`\p{…}`), no `\x{…}`, `\u`, `\U` escapes; `\d`, `\w`, `\s`,
//!   `\b` and `(?i)` are ASCII-only in both;
//! - valid `regex` crate syntax (so no look-around, back-references,
//!   recursion `(?1)`, possessive or atomic groups);
//! - none of the syntax PCRE reads differently or not at all: the `R`, `u`
//!   and `x` flags, class set operations (`&&`, `--`, `~~`), nested
//!   brackets (`[a[bc]]`), the word-boundary forms `\b{start}`, `\<`, `\>`,
//!   `\v` (vertical whitespace in PCRE, a tab in Rust), a repetition of a
//!   repetition (`a{2}{3}`) and group names PCRE refuses;
//! - no unbounded repetition (`*`, `+`, `{n,}`) inside a repetition that
//!   can repeat (`^(a+)+$`, `(a*)*`, `^/(?:a+){12}$`), and no alternation
//!   inside an unbounded repetition whose branches can start with the same
//!   character or match empty (`(a|a)*`, `(a|ab)+`, `(a|)*`), and no two
//!   unbounded repetitions in a row that can match the same character
//!   (`a*a*`, `\d+[0-9]*`): the shapes that backtrack exponentially or
//!   polynomially;
//! - nested repetition counts multiplying to at most [`MAX_COUNT`]
//!   (`(?:a{1000}){1000}` is refused), at most [`MAX_LEN`] bytes, and at most
//!   [`MAX_COMPILED`] bytes compiled by PCRE as [`compiled_size`] estimates
//!   it (PCRE copies a group once per count: `(?:abcdefghijklmnopqrstuvwxyz){1200}`
//!   is past the 64 KiB PCRE compiles at most, and the edge could not use it).
//!
//! The edge also bounds every match at run time (`lua_regex_match_limit`
//! in the edge's nginx template).

use regex_syntax::ast::{
    self, Assertion, AssertionKind, Ast, ClassSet, ClassSetItem, Flag, FlagsItemKind, GroupKind,
    HexLiteralKind, LiteralKind, RepetitionKind, RepetitionRange, SpecialLiteralKind,
};
use regex_syntax::hir::{self, Hir, HirKind};

/// The longest rule regex, in bytes.
pub const MAX_LEN: usize = 4096;
/// The largest product of nested repetition counts.
pub const MAX_COUNT: u64 = 1000;
/// The largest compiled PCRE pattern, as [`compiled_size`] estimates it:
/// half of the 65,536 bytes PCRE1 (link size 2, as Debian builds it)
/// compiles at most, so that no estimate falls short of it.
pub const MAX_COMPILED: u64 = 32_768;

/// Why a rule regex is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not valid `regex` crate syntax; the parser's message.
    Syntax(String),
    /// Valid in Rust, but PCRE would read it otherwise or not at all.
    NotPortable(&'static str),
    /// An unbounded repetition inside another one.
    NestedRepetition,
    /// Overlapping or empty alternatives under an unbounded repetition.
    AmbiguousAlternation,
    /// Two unbounded repetitions in a row that can match the same byte.
    AdjacentRepetition,
    /// Repetition counts (or the length) past the limits.
    TooLarge,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Syntax(m) => write!(f, "not a valid regular expression: {m}"),
            Refusal::NotPortable(what) => write!(
                f,
                "uses {what}, which the edge's PCRE reads differently or not at all"
            ),
            Refusal::NestedRepetition => f.write_str(
                "an unbounded repetition inside a repetition (like `(a+)+` or `(?:a+){12}`) \
                 can backtrack exponentially on the edge",
            ),
            Refusal::AdjacentRepetition => f.write_str(
                "two unbounded repetitions in a row that can match the same character (like \
                 `a*a*`) backtrack polynomially on the edge",
            ),
            Refusal::AmbiguousAlternation => f.write_str(
                "alternatives that can start alike or match empty inside an unbounded \
                 repetition (like `(a|ab)*`) can backtrack exponentially on the edge",
            ),
            Refusal::TooLarge => write!(
                f,
                "too large: nested repetition counts multiply past {MAX_COUNT}, longer than \
                 {MAX_LEN} bytes, or over {} KiB once the edge's PCRE compiles it (it copies \
                 a group once per count)",
                MAX_COMPILED / 1024
            ),
        }
    }
}

/// Check one rule regex.
///
/// # Errors
/// The first reason it is refused.
pub fn check(pattern: &str) -> Result<(), Refusal> {
    if pattern.len() > MAX_LEN {
        return Err(Refusal::TooLarge);
    }
    if !pattern.is_ascii() {
        return Err(Refusal::NotPortable(
            "a non-ASCII character (PCRE matches bytes: write them as `\\xHH`)",
        ));
    }
    let ast = ast::parse::Parser::new()
        .parse(pattern)
        .map_err(|e| Refusal::Syntax(e.kind().to_string()))?;
    // The AST walk first: it names what is not portable, which the
    // translation below would only call "not allowed".
    Walk {
        pattern,
        fold: folds_case(pattern),
    }
    .ast(&ast, false, 1)?;
    if compiled_size(&ast) > MAX_COMPILED {
        return Err(Refusal::TooLarge);
    }
    // Translating as `explain` compiles (bytes, Unicode off) catches what
    // the AST allows but that engine does not.
    translator(false)
        .translate(pattern, &ast)
        .map_err(|e| Refusal::Syntax(e.kind().to_string()))?;
    Ok(())
}

/// An upper estimate of the bytes PCRE1 (8-bit, link size 2) compiles
/// `ast` into, measured against `pcre_compile` (`PCRE_INFO_SIZE`): a
/// character 2 bytes, a bracketed class 33 (its bitmap), `.`, `\d` and an
/// assertion 1, a group's brackets 6 (8 capturing), an alternative 3. A
/// repetition of one item is that item with its counts (6 bytes, 8 at
/// least); of anything else,
/// PCRE writes the group out once per count (`(?:ab){3}` is `ab` three
/// times, `(?:ab){1,3}` three nested optional copies), 7 bytes over each.
#[must_use]
pub fn compiled_size(ast: &Ast) -> u64 {
    const BASE: u64 = 7;
    BASE.saturating_add(size(ast))
}

fn size(ast: &Ast) -> u64 {
    match ast {
        Ast::Empty(_) | Ast::Flags(_) => 0,
        Ast::Literal(_) => 2,
        Ast::Dot(_) | Ast::ClassPerl(_) | Ast::Assertion(_) => 1,
        // Unicode classes are refused before.
        Ast::ClassBracketed(_) | Ast::ClassUnicode(_) => 33,
        Ast::Group(g) => {
            let brackets = if matches!(g.kind, GroupKind::NonCapturing(_)) {
                6
            } else {
                8
            };
            size(&g.ast).saturating_add(brackets)
        }
        Ast::Alternation(alt) => alt
            .asts
            .iter()
            .fold(0u64, |sum, a| sum.saturating_add(size(a)).saturating_add(3)),
        Ast::Concat(c) => c
            .asts
            .iter()
            .fold(0u64, |sum, a| sum.saturating_add(size(a))),
        Ast::Repetition(rep) => {
            let sub = size(&rep.ast);
            if matches!(
                *rep.ast,
                Ast::Literal(_) | Ast::Dot(_) | Ast::ClassPerl(_) | Ast::ClassBracketed(_)
            ) {
                // One item and its counts (`OP_EXACT` + `OP_UPTO`: 4
                // bytes each for a character; `OP_CRRANGE`: 5 after a
                // class).
                return sub.saturating_add(6).max(8);
            }
            let copies = match &rep.op.kind {
                RepetitionKind::ZeroOrOne => 1,
                RepetitionKind::ZeroOrMore | RepetitionKind::OneOrMore => 2,
                RepetitionKind::Range(RepetitionRange::Exactly(n)) => u64::from(*n).max(1),
                RepetitionKind::Range(RepetitionRange::AtLeast(n)) => u64::from(*n) + 1,
                RepetitionKind::Range(RepetitionRange::Bounded(_, m)) => u64::from(*m).max(1),
            };
            sub.saturating_add(7).saturating_mul(copies)
        }
    }
}

/// A group name PCRE1 takes: `[A-Za-z_][A-Za-z0-9_]{0,31}`.
fn pcre_group_name(name: &str) -> bool {
    name.len() <= 32
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Translation as `edgestate::edge` compiles a rule: bytes, Unicode off.
/// `fold`: read every part case-folded ([`Walk::part`]).
fn translator(fold: bool) -> hir::translate::Translator {
    hir::translate::TranslatorBuilder::new()
        .unicode(false)
        .utf8(false)
        .case_insensitive(fold)
        .build()
}

/// Whether a flag group anywhere in `pattern` turns case folding on
/// (`(?i)`, `(?si:…)`): the walk then reads every part folded, since a
/// part translated alone would lose the flag set before it (`(?i)A+a+`
/// is two repetitions of the same bytes). Over-approximate on purpose.
fn folds_case(pattern: &str) -> bool {
    pattern.match_indices("(?").any(|(i, _)| {
        pattern[i + 2..]
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .any(|c| c == 'i')
    })
}

struct Walk<'a> {
    pattern: &'a str,
    /// The pattern folds case somewhere ([`folds_case`]).
    fold: bool,
}

impl Walk<'_> {
    /// A part of the pattern translated alone, as the whole pattern reads
    /// it (case folded when the pattern folds case anywhere).
    fn part(&self, ast: &Ast) -> Option<hir::Hir> {
        translator(self.fold).translate(self.pattern, ast).ok()
    }
}

impl Walk<'_> {
    fn ast(&self, ast: &Ast, under_unbounded: bool, count: u64) -> Result<(), Refusal> {
        match ast {
            Ast::Empty(_) | Ast::Dot(_) | Ast::ClassPerl(_) => Ok(()),
            Ast::ClassUnicode(_) => Err(Refusal::NotPortable(
                "a Unicode class (`\\p{…}`, `\\pL`): PCRE matches bytes",
            )),
            Ast::Flags(set) => flags(&set.flags),
            Ast::Literal(lit) => literal(lit),
            Ast::Assertion(a) => assertion(a),
            Ast::ClassBracketed(class) => class_set(&class.kind),
            Ast::Repetition(rep) => {
                let (unbounded, n) = match &rep.op.kind {
                    RepetitionKind::ZeroOrOne => (false, 1),
                    RepetitionKind::ZeroOrMore | RepetitionKind::OneOrMore => (true, 1),
                    RepetitionKind::Range(RepetitionRange::Exactly(n)) => (false, *n),
                    RepetitionKind::Range(RepetitionRange::AtLeast(n)) => (true, *n),
                    RepetitionKind::Range(RepetitionRange::Bounded(_, m)) => (false, *m),
                };
                if matches!(*rep.ast, Ast::Repetition(_)) {
                    return Err(Refusal::NotPortable(
                        "a repetition of a repetition (`a{2}{3}`, which PCRE refuses: write \
                         `(?:a{2}){3}`; `a++`, possessive in PCRE)",
                    ));
                }
                if unbounded && under_unbounded {
                    return Err(Refusal::NestedRepetition);
                }
                let count = count.saturating_mul(u64::from(n.max(1)));
                if count > MAX_COUNT {
                    return Err(Refusal::TooLarge);
                }
                // A counted repetition (`{12}`, `{1,3}`) of something that
                // ends in an unbounded repetition able to take the next
                // round's first byte: `(?:a+){12}` is `a+a+…a+`.
                if !unbounded
                    && n > 1
                    && let Some(sub) = self.part(&rep.ast)
                    && tail(&sub).intersects(&first(&sub))
                {
                    return Err(Refusal::NestedRepetition);
                }
                self.ast(&rep.ast, under_unbounded || unbounded, count)
            }
            Ast::Group(group) => {
                match &group.kind {
                    GroupKind::NonCapturing(f) => flags(f)?,
                    GroupKind::CaptureName { name, .. } if !pcre_group_name(&name.name) => {
                        return Err(Refusal::NotPortable(
                            "a group name PCRE refuses (a letter or `_`, then letters, digits \
                             or `_`, at most 32)",
                        ));
                    }
                    _ => {}
                }
                self.ast(&group.ast, under_unbounded, count)
            }
            Ast::Alternation(alt) => {
                if under_unbounded {
                    self.alternatives(&alt.asts)?;
                }
                alt.asts
                    .iter()
                    .try_for_each(|a| self.ast(a, under_unbounded, count))
            }
            Ast::Concat(concat) => {
                self.adjacent(&concat.asts)?;
                concat
                    .asts
                    .iter()
                    .try_for_each(|a| self.ast(a, under_unbounded, count))
            }
        }
    }

    /// In a concatenation: an unbounded repetition, then (past parts that
    /// can match empty) another whose bytes it can also match — each
    /// looked for inside groups and alternations too (`(a+)(a+)`,
    /// `(?:x|a+)(?:x|a+)`, `(?:a+c?)a+`): where one item can end with
    /// such a repetition and the next can start with one.
    fn adjacent(&self, items: &[Ast]) -> Result<(), Refusal> {
        let mut open: Option<Bytes> = None;
        for item in items {
            // What does not translate is named by the walk, or refused by
            // the whole pattern's translation.
            let Some(hir) = self.part(item) else {
                open = None;
                continue;
            };
            if let (Some(o), Some(lead)) = (&open, edge_repetition(&hir, false))
                && o.intersects(&lead)
            {
                return Err(Refusal::AdjacentRepetition);
            }
            let trail = edge_repetition(&hir, true);
            // One byte the open repetition matches too (`\w+_\w+`,
            // `\d+0\d+`): it can take that byte itself, so the split
            // between it and the next repetition stays ambiguous.
            let absorbed = trail.is_none()
                && matches!((&open, single_byte(&hir)), (Some(o), Some(b)) if b.within(o));
            open = if absorbed {
                open
            } else if nullable(&hir) {
                union(open, trail)
            } else {
                trail
            };
        }
        Ok(())
    }

    /// Under an unbounded repetition: no branch matches empty, and no two
    /// branches can start with the same byte.
    fn alternatives(&self, branches: &[Ast]) -> Result<(), Refusal> {
        let mut seen = Bytes::default();
        for branch in branches {
            let Some(hir) = self.part(branch) else {
                continue;
            };
            if nullable(&hir) {
                return Err(Refusal::AmbiguousAlternation);
            }
            let first = first(&hir);
            if seen.intersects(&first) {
                return Err(Refusal::AmbiguousAlternation);
            }
            seen.add(&first);
        }
        Ok(())
    }
}

fn flags(f: &ast::Flags) -> Result<(), Refusal> {
    for item in &f.items {
        match item.kind {
            FlagsItemKind::Flag(Flag::CRLF) => {
                return Err(Refusal::NotPortable("the `R` flag (recursion in PCRE)"));
            }
            FlagsItemKind::Flag(Flag::Unicode) => {
                return Err(Refusal::NotPortable("the `u` flag"));
            }
            FlagsItemKind::Flag(Flag::IgnoreWhitespace) => {
                return Err(Refusal::NotPortable(
                    "the `x` flag (PCRE keeps the spaces inside classes)",
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

fn literal(lit: &ast::Literal) -> Result<(), Refusal> {
    match lit.kind {
        LiteralKind::HexFixed(HexLiteralKind::UnicodeShort | HexLiteralKind::UnicodeLong)
        | LiteralKind::HexBrace(_) => Err(Refusal::NotPortable(
            "a `\\x{…}`, `\\u` or `\\U` escape (write a byte as `\\xHH`)",
        )),
        LiteralKind::Special(SpecialLiteralKind::VerticalTab) => Err(Refusal::NotPortable(
            "`\\v` (vertical whitespace in PCRE, a tab in Rust; write `\\x0B`)",
        )),
        _ => Ok(()),
    }
}

fn assertion(a: &Assertion) -> Result<(), Refusal> {
    match a.kind {
        AssertionKind::WordBoundaryStart
        | AssertionKind::WordBoundaryEnd
        | AssertionKind::WordBoundaryStartAngle
        | AssertionKind::WordBoundaryEndAngle
        | AssertionKind::WordBoundaryStartHalf
        | AssertionKind::WordBoundaryEndHalf => Err(Refusal::NotPortable(
            "a `\\b{…}`, `\\<` or `\\>` word boundary",
        )),
        _ => Ok(()),
    }
}

fn class_set(set: &ClassSet) -> Result<(), Refusal> {
    match set {
        ClassSet::BinaryOp(_) => Err(Refusal::NotPortable(
            "a class set operation (`&&`, `--`, `~~`)",
        )),
        ClassSet::Item(item) => class_item(item),
    }
}

fn class_item(item: &ClassSetItem) -> Result<(), Refusal> {
    match item {
        ClassSetItem::Bracketed(_) => Err(Refusal::NotPortable(
            "a class nested in a class (`[a[bc]]`)",
        )),
        ClassSetItem::Union(u) => u.items.iter().try_for_each(class_item),
        ClassSetItem::Literal(lit) => literal(lit),
        ClassSetItem::Range(r) => literal(&r.start).and_then(|()| literal(&r.end)),
        ClassSetItem::Unicode(_) => Err(Refusal::NotPortable(
            "a Unicode class (`\\p{…}`, `\\pL`): PCRE matches bytes",
        )),
        _ => Ok(()),
    }
}

/// A set of bytes.
#[derive(Default, Clone)]
struct Bytes([u128; 2]);

impl Bytes {
    fn insert_range(&mut self, lo: u8, hi: u8) {
        for b in lo..=hi {
            self.0[usize::from(b >> 7)] |= 1u128 << (b & 127);
        }
    }

    fn add(&mut self, other: &Bytes) {
        self.0[0] |= other.0[0];
        self.0[1] |= other.0[1];
    }

    fn intersects(&self, other: &Bytes) -> bool {
        self.0[0] & other.0[0] != 0 || self.0[1] & other.0[1] != 0
    }

    fn within(&self, other: &Bytes) -> bool {
        self.0[0] & !other.0[0] == 0 && self.0[1] & !other.0[1] == 0
    }
}

/// The bytes of the unbounded repetitions a match of `h` can begin with
/// (`from_end`: end with), through groups, alternations, bounded
/// repetitions and the parts of a concatenation that can match empty;
/// `None` when none can.
fn edge_repetition(h: &Hir, from_end: bool) -> Option<Bytes> {
    match h.kind() {
        HirKind::Repetition(r) if r.max.is_none() => Some(all(&r.sub)),
        HirKind::Repetition(r) => edge_repetition(&r.sub, from_end),
        HirKind::Capture(c) => edge_repetition(&c.sub, from_end),
        HirKind::Concat(parts) => {
            let order: Box<dyn Iterator<Item = &Hir>> = if from_end {
                Box::new(parts.iter().rev())
            } else {
                Box::new(parts.iter())
            };
            let mut out = None;
            for p in order {
                out = union(out, edge_repetition(p, from_end));
                if !nullable(p) {
                    break;
                }
            }
            out
        }
        HirKind::Alternation(branches) => branches
            .iter()
            .fold(None, |out, b| union(out, edge_repetition(b, from_end))),
        _ => None,
    }
}

/// The bytes of either (`None` for neither).
fn union(a: Option<Bytes>, b: Option<Bytes>) -> Option<Bytes> {
    match (a, b) {
        (Some(mut a), Some(b)) => {
            a.add(&b);
            Some(a)
        }
        (a, b) => a.or(b),
    }
}

/// The bytes of `h` when it matches exactly one byte (a one-byte
/// literal or a class), else `None`.
fn single_byte(h: &Hir) -> Option<Bytes> {
    match h.kind() {
        HirKind::Literal(l) if l.0.len() == 1 => Some(all(h)),
        HirKind::Class(_) => Some(all(h)),
        HirKind::Capture(c) => single_byte(&c.sub),
        _ => None,
    }
}

fn nullable(h: &Hir) -> bool {
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => true,
        HirKind::Literal(l) => l.0.is_empty(),
        HirKind::Class(_) => false,
        HirKind::Repetition(r) => r.min == 0 || nullable(&r.sub),
        HirKind::Capture(c) => nullable(&c.sub),
        HirKind::Concat(hs) => hs.iter().all(nullable),
        HirKind::Alternation(hs) => hs.iter().any(nullable),
    }
}

/// The bytes an unbounded repetition at the end of a match of `h` (past
/// only parts that can match empty) can take.
fn tail(h: &Hir) -> Bytes {
    let mut out = Bytes::default();
    match h.kind() {
        HirKind::Repetition(r) if r.max.is_none() => out = all(&r.sub),
        HirKind::Repetition(r) => out = tail(&r.sub),
        HirKind::Capture(c) => out = tail(&c.sub),
        HirKind::Concat(hs) => {
            for h in hs.iter().rev() {
                out.add(&tail(h));
                if !nullable(h) {
                    break;
                }
            }
        }
        HirKind::Alternation(hs) => {
            for h in hs {
                out.add(&tail(h));
            }
        }
        _ => {}
    }
    out
}

/// Every byte a match of `h` can hold.
fn all(h: &Hir) -> Bytes {
    let mut out = Bytes::default();
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(l) => {
            for &b in &l.0 {
                out.insert_range(b, b);
            }
        }
        HirKind::Class(_) => out = first(h),
        HirKind::Repetition(r) => out = all(&r.sub),
        HirKind::Capture(c) => out = all(&c.sub),
        HirKind::Concat(hs) | HirKind::Alternation(hs) => {
            for h in hs {
                out.add(&all(h));
            }
        }
    }
    out
}

/// The bytes a match of `h` can start with (UTF-8 lead bytes for
/// Unicode classes: encoding preserves order, so a range's lead bytes are
/// those between its ends').
fn first(h: &Hir) -> Bytes {
    let mut out = Bytes::default();
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(l) => {
            if let Some(&b) = l.0.first() {
                out.insert_range(b, b);
            }
        }
        HirKind::Class(hir::Class::Bytes(c)) => {
            for r in c.ranges() {
                out.insert_range(r.start(), r.end());
            }
        }
        HirKind::Class(hir::Class::Unicode(c)) => {
            let lead = |ch: char| {
                let mut buf = [0u8; 4];
                ch.encode_utf8(&mut buf).as_bytes()[0]
            };
            for r in c.ranges() {
                out.insert_range(lead(r.start()), lead(r.end()));
            }
        }
        HirKind::Repetition(r) => out = first(&r.sub),
        HirKind::Capture(c) => out = first(&c.sub),
        HirKind::Concat(hs) => {
            for h in hs {
                out.add(&first(h));
                if !nullable(h) {
                    break;
                }
            }
        }
        HirKind::Alternation(hs) => {
            for h in hs {
                out.add(&first(h));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catastrophic_recursive_and_rust_only_patterns_are_refused() {
        for (pattern, want) in [
            (r"^(a+)+$", Refusal::NestedRepetition),
            (r"(a*)*", Refusal::NestedRepetition),
            (r"(?:x+y?)*z", Refusal::NestedRepetition),
            (r"(a{2,})+", Refusal::NestedRepetition),
            // Not exponential, but the rule is kept simple: no unbounded
            // repetition inside another.
            (r"(?:/[^/]+)*", Refusal::NestedRepetition),
            (r"(a|a)*", Refusal::AmbiguousAlternation),
            (r"^(a|ab)+$", Refusal::AmbiguousAlternation),
            (r"(a|)*", Refusal::AmbiguousAlternation),
            (r"(\d|[0-5])+", Refusal::AmbiguousAlternation),
            (r"^/(?:a+){12}$", Refusal::NestedRepetition),
            (r"(?:x*){2}", Refusal::NestedRepetition),
            (r"^/(?:a+|b){3}$", Refusal::NestedRepetition),
            (r"^/(?:a+b?){3}$", Refusal::NestedRepetition),
            (r"^/a*a*$", Refusal::AdjacentRepetition),
            (r"\d+[0-9]*", Refusal::AdjacentRepetition),
            (r"x.*(?:b)?.*y", Refusal::AdjacentRepetition),
            (r"^/(a+)(a+)(a+)(a+)(a+)$", Refusal::AdjacentRepetition),
            (
                r"^/(?:x|a+)(?:x|a+)(?:x|a+)(?:x|a+)(?:x|a+)$",
                Refusal::AdjacentRepetition,
            ),
            (
                r"^/(?:a+c?)(?:a+c?)(?:a+c?)(?:a+c?)a+$",
                Refusal::AdjacentRepetition,
            ),
            (r"^/(?:b(?:a+))(?:(?:a*)c)$", Refusal::AdjacentRepetition),
            (r"(?i)^/A+a+A+a+$", Refusal::AdjacentRepetition),
            (r"(?i)^/(?:a|A)+$", Refusal::AmbiguousAlternation),
            (r"^/\w+_\w+_\w+_\w+$", Refusal::AdjacentRepetition),
            (r"^/\d+0\d+$", Refusal::AdjacentRepetition),
            (r"(?:a{1000}){1000}", Refusal::TooLarge),
            (r"(?:a{100}){100}", Refusal::TooLarge),
            (
                r"^/(?:abcdefghijklmnopqrstuvwxyz){1000}$",
                Refusal::TooLarge,
            ),
            (r"^/(?:[a-z][0-9]){500}$", Refusal::TooLarge),
        ] {
            assert_eq!(check(pattern), Err(want), "{pattern}");
        }
        for pattern in [
            r"(?R)a",
            r"(?R:a)",
            r"(?u)\w",
            r"[a-z&&[^aeiou]]",
            r"[a-z--b]",
            r"[a[bc]]",
            r"\bx\b{start}",
            r"\<word\>",
            r"\u0041",
            r"\U00000041",
            r"\p{Letter}",
            r"\pL",
            r"[\p{Greek}a]",
            r"\x{263A}",
            r"\x{41}",
            r"é",
            r"(?x)a b",
            r"\v",
            r"a{2}{3}",
            // Possessive in PCRE, `(a+)+` in Rust.
            r"a++",
            r"(?P<aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa>a)",
            r"(?P<a.b>x)",
            r"(?P<a[1]>x)",
        ] {
            assert!(
                matches!(check(pattern), Err(Refusal::NotPortable(_))),
                "{pattern}: {:?}",
                check(pattern)
            );
        }
        for pattern in [r"(?1)", r"(a)\1", r"(?=a)", r"(?<=a)b", r"(?>a)", r"a{,3}"] {
            assert!(
                matches!(check(pattern), Err(Refusal::Syntax(_))),
                "{pattern}: {:?}",
                check(pattern)
            );
        }
        assert_eq!(check(&"a".repeat(MAX_LEN + 1)), Err(Refusal::TooLarge));
    }

    #[test]
    fn ordinary_rule_patterns_pass() {
        for pattern in [
            r"\.(mp4|m4s|ts)$",
            r"^/api/v[0-9]+/",
            r"^/(?:img|css|js)/.*\.(?:png|jpe?g|gif)$",
            r"(?i)^/static/",
            r"^/a{1,3}/b{2}",
            r"\d{1,3}(\.\d{1,3}){3}",
            r"^/(foo|bar)*$",
            r"[[:alpha:]]+\d\w\s",
            r"\x41\xe9",
            r"(?i)^/admin",
            r"^/[a-z]+/[a-z]*$",
            r"\d+\.\d+",
            r"^/(?:a+b){3}$",
            r"^(?:/[^/]+){0,8}$",
            r"a{1000}",
            r"^/(\w+)/(\w+)$",
            r"^/(\d+)x(\d+)\.jpg$",
            r"^/(?:img|css)/[a-z]+$",
        ] {
            assert_eq!(check(pattern), Ok(()), "{pattern}");
        }
    }
}
