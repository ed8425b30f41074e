//! Diagnostics: every problem edgeform finds in a config repository.
//!
//! A [`Diagnostic`] names its file (relative to the repository root), its
//! position (1-based line and column, byte span for the snippet), a stable
//! `code` (documented in `docs/diagnostics.md`), a message and an optional
//! help. Validation collects them all and never stops at the first.
//! Rendering lives in [`crate::report`].

use std::sync::Arc;

use yamlspan::Span;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// One problem, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable kebab-case code, e.g. `duplicate-host`.
    pub code: &'static str,
    pub message: String,
    /// Path relative to the repository root, `/`-separated.
    pub file: Arc<str>,
    pub span: Span,
    pub help: Option<String>,
    /// A secret written in the file at this diagnostic (`inline-secret`):
    /// masked wherever the file's text is shown.
    pub secret: Option<String>,
}

impl Diagnostic {
    #[must_use]
    pub fn error(code: &'static str, file: &Arc<str>, span: Span, message: String) -> Self {
        Diagnostic {
            severity: Severity::Error,
            code,
            message,
            file: file.clone(),
            span,
            help: None,
            secret: None,
        }
    }

    #[must_use]
    pub fn warning(code: &'static str, file: &Arc<str>, span: Span, message: String) -> Self {
        Diagnostic {
            severity: Severity::Warning,
            code,
            message,
            file: file.clone(),
            span,
            help: None,
            secret: None,
        }
    }

    #[must_use]
    pub fn with_help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }

    /// Mask `secret` in snippets of this diagnostic's file.
    #[must_use]
    pub fn with_secret(mut self, secret: impl Into<String>) -> Self {
        self.secret = Some(secret.into());
        self
    }

    /// `file:line:col`.
    #[must_use]
    pub fn location(&self) -> String {
        // A file name from the repository may hold control characters: it
        // never drives a terminal or forges a log line.
        format!(
            "{}:{}:{}",
            edgestate::untrusted::escape(&self.file),
            self.span.line,
            self.span.column
        )
    }
}

/// Sort for output (by file, position, severity, code) and keep one
/// diagnostic per place and severity: the schema and a semantic rule may
/// both object to the same value, and the first (the schema's, sorted by
/// insertion) says it well enough.
pub fn sort(diagnostics: &mut Vec<Diagnostic>) {
    let mut seen = std::collections::HashSet::new();
    diagnostics.retain(|d| {
        // Warnings are distinct rules even at one place; errors at one
        // place are the same complaint said twice.
        let what = if d.severity == Severity::Warning {
            d.message.as_str()
        } else {
            ""
        };
        seen.insert((
            d.file.clone(),
            d.span.line,
            d.span.column,
            d.severity,
            what.to_owned(),
        ))
    });
    sort_only(diagnostics);
}

fn sort_only(diagnostics: &mut [Diagnostic]) {
    diagnostics.sort_by(|a, b| {
        (
            &a.file,
            a.span.line,
            a.span.column,
            a.severity,
            a.code,
            &a.message,
        )
            .cmp(&(
                &b.file,
                b.span.line,
                b.span.column,
                b.severity,
                b.code,
                &b.message,
            ))
    });
}

#[must_use]
pub fn has_errors(diagnostics: &[Diagnostic]) -> bool {
    diagnostics.iter().any(|d| d.severity == Severity::Error)
}
