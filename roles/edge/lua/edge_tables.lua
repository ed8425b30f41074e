-- Generated from the Rust definitions in edgestate (edgestate/src/lua.rs):
-- do not edit. `EDGEFORM_BLESS=1 cargo test -p edgestate lua` rewrites it.
-- The edge's tables: edgestate::edge and edgestate::site.

return {
  -- Methods the WAF accepts (edgestate::edge::METHODS).
  METHODS = { "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS" },
  -- The WAF's rule for any other method.
  WAF_BAD_METHOD = "bad-method",
  -- WAF rules, in order: name, needles (as written; edge_norm.waf_fold spells them).
  WAF_RULES = {
    { "traversal", { "../", "..\\", "/etc/passwd" } },
    { "sqli", { "union select", "' or '1'='1", " or 1=1", "sleep(", "information_schema", ";--" } },
    { "xss", { "<script", "javascript:", "onerror=", "onload=" } },
  },
  -- The reason of a strict WAF's refusal, by its first matching rule.
  WAF_REASON = {
    ["bad-method"] = "waf-bad-method",
    ["traversal"] = "waf-traversal",
    ["sqli"] = "waf-sqli",
    ["xss"] = "waf-xss",
  },
  -- Extensions hotlink protection applies to.
  HOTLINK_EXT = { ".jpg", ".jpeg", ".png", ".gif", ".webp", ".avif", ".svg", ".ico", ".mp4", ".webm", ".m4v", ".mov", ".m3u8", ".ts", ".m4s", ".mpd", ".mp3", ".m4a", ".aac", ".ogg", ".woff", ".woff2", ".pdf", ".zip" },
  -- rate_mode limits: requests per second, burst.
  RATE = { normal = { 20, 40 }, strict = { 5, 10 } },
  -- The statuses an edge rule may redirect with.
  REDIRECT_STATUSES = { 301, 302, 307, 308 },
  -- Seconds a response the origin gives no freshness for is cached.
  DEFAULT_TTL = 600,
  -- Request body limits (bytes): a site's default max_body_size, and
  -- the ceiling (nginx's client_max_body_size; a document above it is bad).
  DEFAULT_MAX_BODY_SIZE = 104857600,
  MAX_BODY_SIZE_CEILING = 1073741824,
  -- The most origins a site has (origin and its fallback_origins).
  MAX_ORIGINS = 4,
  -- The challenge: its cookie, the proof of work's zero bits, the longest
  -- expiry and counter (decimal digits) a clearance may carry.
  CLEARANCE_COOKIE = "edgeform_clearance",
  CHALLENGE_BITS = 16,
  MAX_EXPIRY_DIGITS = 12,
  MAX_COUNTER_DIGITS = 16,
  -- ACME HTTP-01 challenges: the path, the token's shortest and longest.
  ACME_CHALLENGE_PREFIX = "/.well-known/acme-challenge/",
  ACME_TOKEN_MIN = 8,
  ACME_TOKEN_MAX = 128,
  -- The site document's fields and JSON types (`?`: may be absent or null).
  FIELDS = {
    cache_rules = "array",
    cached = "boolean",
    cors_mode = "string",
    edge_rules = "array",
    fallback_origins = "array?",
    geo_codes = "string",
    geo_mode = "string",
    hotlink_mode = "string",
    https_redirect = "boolean?",
    ip_list = "string",
    ip_mode = "string",
    max_body_size = "uint64?",
    origin = "string",
    origin_tls_verify = "boolean?",
    rate_mode = "string",
    skippable = "array?",
    tls = "string?",
    waf_mode = "string",
  },
  CACHE_RULE = {
    action = "string",
    match_type = "string",
    match_value = "string",
    ttl = "uint32?",
  },
  EDGE_RULE = {
    action = "string",
    match_type = "string",
    match_value = "string",
    redirect_status = "uint16?",
    redirect_to = "string?",
  },
  -- X-Edgeform-Reason values (edgestate::edge::reason).
  REASON = {
    BAD_REQUEST = "bad-request",
    BAD_PATH = "bad-path",
    NON_CANONICAL_PATH = "non-canonical-path",
    UNKNOWN_HOST = "unknown-host",
    BAD_DOCUMENT = "bad-document",
    SUSPENDED = "suspended",
    IP_NOT_ALLOWED = "ip-not-allowed",
    IP_BLOCKED = "ip-blocked",
    GEO_NOT_ALLOWED = "geo-not-allowed",
    GEO_BLOCKED = "geo-blocked",
    WAF_BAD_METHOD = "waf-bad-method",
    WAF_TRAVERSAL = "waf-traversal",
    WAF_SQLI = "waf-sqli",
    WAF_XSS = "waf-xss",
    HOTLINK = "hotlink",
    CORS_ORIGIN = "cors-origin",
    CORS_PREFLIGHT = "cors-preflight",
    CHALLENGE = "challenge",
    EDGE_RULE = "edge-rule",
    HTTPS_REDIRECT = "https-redirect",
    MISDIRECTED_REQUEST = "misdirected-request",
    BODY_TOO_LARGE = "body-too-large",
    RATE_LIMITED = "rate-limited",
    CONTROL_PLANE_UNREACHABLE = "control-plane-unreachable",
    ACME_CHALLENGE = "acme-challenge",
    ACME_BAD_TOKEN = "acme-bad-token",
    ACME_UNKNOWN_TOKEN = "acme-unknown-token",
    ACME_REDIS_UNREACHABLE = "acme-redis-unreachable",
  },
}
