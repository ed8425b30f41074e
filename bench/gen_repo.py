#!/usr/bin/env python3
"""Generate a large, deterministic, *valid* edgeform config repository.

    python3 bench/gen_repo.py [--out .bench/synthetic] [--seed 1] \
        [--sites 100000] [--zones 1000] [--routes 100] [--nodes 1200]

The output mirrors the example repository at the top of the project
(`cluster.yaml`, `sites/`, `zones/`, `nodes/`), with the same mix of styles:
block and flow lists, comments, quoting, optional keys left out. Every value
satisfies the JSON Schemas in `schemas/` and the semantic rules of docs/configuration.md,
so `edgeform check` must exit 0 and print no warning:

- hostnames (hosts and aliases) are unique across the repository;
- zone routes are unique and never overlap between zones (a zone may hold a
  more specific prefix of its own route); host bits are always clear;
  exactly one zone (`global`) holds `0.0.0.0/0` and `::/0`;
- every zone with routes has at least one node, every edge/ingest/origin
  node has a zone, every edge has `redis` and `addresses`;
- node names and addresses are unique; sites only name regions with nodes;
- `geo_codes` are assigned ISO 3166-1 codes, no duplicates; lists are only
  given when their mode is on; `ttl` only with `action: ttl`, redirect
  fields only with `action: redirect`; regexes are valid for Rust's `regex`.

A node serves exactly one zone, so `--nodes` must exceed `--zones` (plus the
unzoned routers) for every routed zone to have a node; with fewer nodes the
generator still writes a valid repository but says how many `empty-zone`
warnings to expect.

Output is byte-identical for the same arguments (never depends on hash
order). It is written to a temporary sibling folder and renamed into place,
with a `.gen.json` stamp (parameters, counts, generation time) that the
benchmark runner reads; edgeform ignores it (only `cluster.yaml`, `sites/`,
`zones/` and `nodes/` are config).

Standard library only.
"""

from __future__ import annotations

import argparse
import bisect
import ipaddress
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

GENERATOR_VERSION = 1

# --------------------------------------------------------------- vocabulary

# Assigned ISO 3166-1 alpha-2 codes (as compiler/src/country.rs).
COUNTRIES = (
    "AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ "
    "BL BM BN BO BQ BR BS BT BV BW BY BZ CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE "
    "DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR GA GB GD GE GF GG GH GI GL GM GN GP GQ GR "
    "GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP KE KG KH KI KM KN KP "
    "KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT "
    "MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW "
    "PY QA RE RO RS RU RW SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG "
    "TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW"
).split()
BLOCKED_USUALLY = ["RU", "CN", "KP", "IR", "BY", "SY", "CU", "VE", "MM", "AF"]
MARKETS = {
    "eu": ["DE", "NL", "GB", "FR", "ES", "IT", "SE", "NO", "DK", "FI", "PL", "AT", "CH", "BE", "IE", "PT", "CZ"],
    "us": ["US", "CA", "MX", "PR"],
    "apac": ["JP", "KR", "SG", "AU", "NZ", "IN", "HK", "TW", "TH", "MY", "ID", "PH", "VN"],
    "sa": ["BR", "AR", "CL", "CO", "PE", "UY", "EC"],
    "me": ["AE", "SA", "IL", "QA", "KW", "OM", "BH", "JO", "TR"],
    "af": ["ZA", "NG", "KE", "EG", "MA", "GH", "TZ", "ET"],
}

# region → [(city code, lat, lon, country)]
CITIES = {
    "eu": [("ams", 52.3676, 4.9041, "NL"), ("fra", 50.1109, 8.6821, "DE"), ("lon", 51.5072, -0.1276, "GB"),
           ("par", 48.8566, 2.3522, "FR"), ("mad", 40.4168, -3.7038, "ES"), ("mil", 45.4642, 9.1900, "IT"),
           ("sto", 59.3293, 18.0686, "SE"), ("waw", 52.2297, 21.0122, "PL"), ("vie", 48.2082, 16.3738, "AT"),
           ("dub", 53.3498, -6.2603, "IE"), ("osl", 59.9139, 10.7522, "NO"), ("hel", 60.1699, 24.9384, "FI")],
    "us": [("nyc", 40.7128, -74.0060, "US"), ("iad", 38.9531, -77.4565, "US"), ("atl", 33.7490, -84.3880, "US"),
           ("chi", 41.8781, -87.6298, "US"), ("dfw", 32.7767, -96.7970, "US"), ("den", 39.7392, -104.9903, "US"),
           ("lax", 34.0522, -118.2437, "US"), ("sjc", 37.3382, -121.8863, "US"), ("sea", 47.6062, -122.3321, "US"),
           ("mia", 25.7617, -80.1918, "US"), ("yyz", 43.6532, -79.3832, "CA"), ("mex", 19.4326, -99.1332, "MX")],
    "apac": [("sin", 1.3521, 103.8198, "SG"), ("hkg", 22.3193, 114.1694, "HK"), ("nrt", 35.6762, 139.6503, "JP"),
             ("syd", -33.8688, 151.2093, "AU"), ("bom", 19.0760, 72.8777, "IN"), ("icn", 37.5665, 126.9780, "KR"),
             ("tpe", 25.0330, 121.5654, "TW"), ("akl", -36.8485, 174.7633, "NZ")],
    "sa": [("gru", -23.5505, -46.6333, "BR"), ("eze", -34.6037, -58.3816, "AR"), ("scl", -33.4489, -70.6693, "CL"),
           ("bog", 4.7110, -74.0721, "CO"), ("lim", -12.0464, -77.0428, "PE")],
    "me": [("dxb", 25.2048, 55.2708, "AE"), ("tlv", 32.0853, 34.7818, "IL"), ("ruh", 24.7136, 46.6753, "SA"),
           ("doh", 25.2854, 51.5310, "QA")],
    "af": [("jnb", -26.2041, 28.0473, "ZA"), ("nbo", -1.2921, 36.8219, "KE"), ("los", 6.5244, 3.3792, "NG"),
           ("cai", 30.0444, 31.2357, "EG"), ("cmn", 33.5731, -7.5898, "MA")],
}
REGION_WEIGHTS = {"eu": 30, "us": 30, "apac": 18, "sa": 8, "me": 6, "af": 8}
REGIONS = list(CITIES)  # stable order

ISPS = ["telekom", "vodafone", "orange", "bt", "kpn", "telia", "comcast", "att", "verizon", "charter",
        "cox", "lumen", "ntt", "kddi", "softbank", "singtel", "telstra", "jio", "airtel", "claro", "vivo",
        "movistar", "etisalat", "stc", "mtn", "safaricom", "liquid", "hetzner", "ovh", "aws", "gcp",
        "azure", "akamai", "iij", "chunghwa", "pldt", "optus", "tim", "fastweb", "swisscom", "proximus",
        "free", "sfr", "plusnet", "sky", "virgin", "rogers", "bell", "shaw", "telus", "tmobile", "sprint"]

ADJ = ["blue", "red", "green", "swift", "bright", "silent", "happy", "clever", "rapid", "north", "south",
       "east", "west", "urban", "alpine", "coastal", "golden", "silver", "iron", "lunar", "solar", "stellar",
       "quantum", "pixel", "cloud", "open", "smart", "prime", "nova", "metro", "royal", "wild", "little",
       "big", "true", "pure", "fresh", "bold", "deep", "high", "next", "first", "grand", "micro", "mega",
       "hyper", "ultra", "zen", "echo", "delta", "sigma", "omega", "alpha", "vivid", "crisp", "lucky",
       "cosmic", "atomic", "polar", "tropic", "misty", "sunny", "rocky", "sandy", "crimson", "amber",
       "ivory", "jade", "onyx", "ruby", "cobalt", "violet", "scarlet", "indigo", "copper", "velvet"]
NOUN = ["fox", "river", "media", "stream", "cast", "tube", "shop", "store", "market", "news", "press",
        "games", "play", "sport", "arena", "studio", "labs", "works", "forge", "hub", "point", "base",
        "port", "gate", "bridge", "tower", "field", "garden", "kitchen", "travel", "wave", "radio", "tv",
        "films", "pics", "photo", "art", "books", "learn", "academy", "school", "health", "clinic", "bank",
        "pay", "wallet", "crypto", "data", "api", "apps", "soft", "code", "dev", "cloud", "host", "net",
        "link", "mail", "chat", "social", "dating", "jobs", "homes", "auto", "motors", "bikes", "boats",
        "air", "fly", "trip", "hotel", "food", "pizza", "coffee", "tea", "wine", "beer", "fashion", "shoes",
        "beauty", "fitness", "yoga", "pets", "vet", "farm", "energy", "solar", "tech", "robot", "drone",
        "space", "rocket", "planet", "ocean", "lake", "forest", "mountain", "valley", "island", "city",
        "town", "village", "club", "league", "team", "fans", "tickets", "events", "music", "beats", "tunes",
        "live", "vod", "anime", "comics", "kids", "family", "weather", "maps", "guide", "reviews", "deals"]
TLDS = ["com"] * 8 + ["net"] * 3 + ["org"] * 2 + ["io", "de", "co.uk", "fr", "nl", "tv", "media", "app",
        "dev", "cloud", "shop", "news", "es", "it", "se", "com.br", "com.au", "jp", "in", "ch", "pl", "eu"]
SUBS = ["static", "cdn", "img", "images", "video", "api", "media", "assets", "dl", "download", "live",
        "vod", "stream", "shop", "m", "app", "files", "content", "edge", "play", "player", "news", "blog"]
ALIAS_SUBS = ["www", "m", "cdn", "static", "media", "old", "beta", "en", "de", "fr", "us", "eu", "shop"]

# Cache rules as operators write them: (match_type, match_value, policy).
# Policies: long/medium/short TTLs, or bypass.
CACHE_RULES = [
    *[("ext", e, "long") for e in [".mp4", ".m4s", ".jpg", ".jpeg", ".png", ".webp", ".avif", ".gif",
                                   ".svg", ".css", ".js", ".mjs", ".woff2", ".woff", ".ttf", ".ico",
                                   ".pdf", ".zip", ".mp3", ".aac", ".webm", ".vtt", ".wasm", ".bin"]],
    *[("ext", e, "short") for e in [".ts", ".m3u8", ".mpd", ".json", ".xml", ".html", ".txt", ".map"]],
    *[("prefix", p, "long") for p in ["/static/", "/img/", "/images/", "/assets/", "/media/", "/videos/",
                                      "/vod/", "/_next/static/", "/build/", "/dist/", "/fonts/",
                                      "/downloads/", "/thumbs/", "/avatars/", "/wp-content/uploads/"]],
    *[("prefix", p, "short") for p in ["/live/", "/hls/", "/dash/", "/feeds/", "/news/", "/blog/"]],
    *[("prefix", p, "bypass") for p in ["/api/", "/api/v1/", "/api/v2/", "/admin/", "/account/", "/cart/",
                                        "/checkout/", "/search/", "/user/", "/private/", "/internal/",
                                        "/healthz/", "/cdn-cgi/", "/graphql/"]],
    *[("exact", p, "medium") for p in ["/robots.txt", "/favicon.ico", "/sitemap.xml", "/manifest.json",
                                       "/ads.txt", "/.well-known/security.txt", "/apple-touch-icon.png",
                                       "/crossdomain.xml", "/feed.xml", "/index.html"]],
    *[("exact", p, "bypass") for p in ["/live/playlist.m3u8", "/sw.js", "/health", "/status", "/login",
                                       "/logout", "/api/session"]],
    *[("regex", r, "long") for r in [r"^/static/[0-9a-f]{8,}\.", r"^/images/[0-9]+x[0-9]+/",
                                     r"^/vod/[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}/",
                                     r"^/u/[a-z0-9_-]{3,32}/avatar\.(png|jpg)$", r"\.(mp4|m4s)$",
                                     r"^/thumbs/(small|medium|large)/", r"^/v[0-9]+\.[0-9]+/",
                                     r"(?i)\.(jpe?g|png|gif|webp)$"]],
    *[("regex", r, "short") for r in [r"^/live/[^/]+/chunk_[0-9]+\.ts$", r"^/hls/.+\.m3u8$",
                                      r"^/[0-9]{4}/[0-9]{2}/[0-9]{2}/", r"^/product/[0-9]+$",
                                      r"^/(en|de|fr|es|it)/"]],
    *[("regex", r, "bypass") for r in [r"^/api/v[0-9]+/", r"^/(cart|checkout|account)(/|$)", r"^/search\?",
                                       r"^/api/internal/", r"^/preview/", r"(?i)^/wp-(admin|login)",
                                       r"\?(.*&)?nocache=1"]],
]
TTLS = {"long": [86400, 604800, 2592000, 31536000], "medium": [300, 600, 3600, 86400],
        "short": [1, 2, 5, 10, 30, 60, 300]}

# Edge rules: (match_type, match_value, action, redirect target or None).
EDGE_RULES = [
    *[("prefix", p, "redirect", t) for p, t in [("/old/", None), ("/legacy/", "/"), ("/v1/", "/v2/"),
                                                ("/api/v1/", "/api/v2/"), ("/shop/", "https://{shop}/"),
                                                ("/blog/", "https://{blog}/"), ("/en-us/", "/en/"),
                                                ("/de-de/", "/de/"), ("/promo/", "/deals/")]],
    *[("exact", p, "redirect", t) for p, t in [("/old-player", "https://{host}/player"), ("/home", "/"),
                                               ("/index.php", "/"), ("/feed", "/feed.xml"),
                                               ("/signin", "/login"), ("/careers", "https://jobs.{domain}/")]],
    *[("regex", r, "redirect", t) for r, t in [(r"^/(en|de|fr)$", None), (r"^/watch/[0-9]+$", "/player"),
                                               (r"^/p/[0-9]+$", None)]],
    *[("prefix", p, "block", None) for p in ["/admin/", "/internal/", "/private/", "/cgi-bin/", "/.git/",
                                             "/phpmyadmin/", "/wp-admin/", "/server-status"]],
    *[("exact", p, "block", None) for p in ["/.env", "/wp-login.php", "/xmlrpc.php", "/config.json",
                                            "/.DS_Store", "/web.config"]],
    *[("regex", r, "block", None) for r in [r"^/admin(/|$)", r"/\.git(/|$)", r"\.(php|asp|aspx|jsp)$",
                                            r"(?i)/(backup|dump)\.(sql|tar|gz)$", r"^/wp-(admin|login|includes)",
                                            r"(?i)^/download/.*\.(exe|msi|dmg)$", r"/\.(svn|hg|bzr)/"]],
    *[("ext", e, "block", None) for e in [".php", ".asp", ".env", ".bak", ".sql", ".git", ".swp"]],
]

WORDS_FOR_COMMENTS = {
    "site": ["Marketing site", "Video platform", "Static assets", "Customer API", "Web shop",
             "News portal", "Tenant subdomains", "Download mirror", "Live streaming", "Image CDN",
             "Legacy site kept for redirects", "Partner portal", "Mobile app backend"],
}

# Origin hostnames are not unique-checked by edgeform; keep them plausible.
ORIGIN_KINDS = ["origin", "origin-1", "backend", "lb", "app", "web", "upstream", "src"]

REDIS_PASSWORD_ENVS = ["EDGEFORM_REDIS_PASSWORD", "REDIS_PASSWORD", "EDGE_REDIS_PW"]

# ------------------------------------------------------------------- YAML

_PLAIN_FIRST = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._^$\\(")
_PLAIN_REST = _PLAIN_FIRST | set(")+?=-|,{}[]*:")


def q(value: str) -> str:
    """A YAML scalar for a string: plain when unambiguous, else single-quoted."""
    if (
        value
        and value[0] in _PLAIN_FIRST
        and all(c in _PLAIN_REST for c in value)
        and ": " not in value
        and not value.endswith(":")
        and not any(c in value for c in ",[]{}")
    ):
        return value
    return "'" + value.replace("'", "''") + "'"


def flow(items) -> str:
    return "[" + ", ".join(items) + "]"


# -------------------------------------------------------------- networks

class Block:
    """Non-overlapping allocation of aligned subnets inside one block."""

    __slots__ = ("base", "bits", "plen", "starts", "ends")

    def __init__(self, base: int, plen: int, bits: int):
        self.base, self.plen, self.bits = base, plen, bits
        self.starts: list[int] = []
        self.ends: list[int] = []

    def try_alloc(self, rng: random.Random, plen: int) -> int | None:
        if plen < self.plen:
            return None
        size = 1 << (self.bits - plen)
        count = 1 << (plen - self.plen)
        for _ in range(8):
            start = self.base + rng.randrange(count) * size
            end = start + size - 1
            i = bisect.bisect_left(self.starts, start)
            if i > 0 and self.ends[i - 1] >= start:
                continue
            if i < len(self.starts) and self.starts[i] <= end:
                continue
            self.starts.insert(i, start)
            self.ends.insert(i, end)
            return start
        return None


def v4(addr: int, plen: int | None = None) -> str:
    s = str(ipaddress.IPv4Address(addr))
    return s if plen is None else f"{s}/{plen}"


def v6(addr: int, plen: int | None = None) -> str:
    s = str(ipaddress.IPv6Address(addr))
    return s if plen is None else f"{s}/{plen}"


# Public-looking first octets for zone blocks: no 0, 10, 100 (CGN), 127,
# 169, 172, 192, 198 (node addresses live in 198.18.0.0/15), 203, 224+.
V4_FIRST_OCTETS = [o for o in range(1, 224) if o not in (10, 100, 127, 169, 172, 192, 198, 203)]

V4_LEN_WEIGHTS = [(16, 1), (17, 2), (18, 3), (19, 6), (20, 9), (21, 11), (22, 16), (23, 14), (24, 30),
                  (25, 2), (26, 2), (27, 1), (28, 1), (29, 1), (32, 1)]
V6_LEN_WEIGHTS = [(36, 2), (40, 4), (44, 6), (48, 30), (52, 3), (56, 6), (64, 3)]


def weighted(rng: random.Random, pairs):
    values = [p[0] for p in pairs]
    weights = [p[1] for p in pairs]
    return rng.choices(values, weights)[0]


# ----------------------------------------------------------------- model

class Zone:
    __slots__ = ("name", "region", "city", "kind", "routes", "fallback", "fallback_style", "comment",
                 "nodes")

    def __init__(self, name, region, city, kind):
        self.name, self.region, self.city, self.kind = name, region, city, kind
        self.routes: list[tuple[str, str | None]] = []  # (cidr, trailing comment)
        self.fallback: str | None = None
        self.fallback_style = "omit"
        self.comment: str | None = None
        self.nodes = 0


def make_zones(rng: random.Random, n_zones: int, n_routes: int, used_names: set[str]):
    """Zones with disjoint route sets; zone 0 (`global`) holds the defaults."""
    zones: list[Zone] = []
    region_list = REGIONS
    weights = [REGION_WEIGHTS[r] for r in region_list]
    zones.append(Zone("global", "eu", CITIES["eu"][0], "global"))
    hubs: dict[str, Zone] = {}
    counters: dict[str, int] = {}
    for i in range(1, n_zones):
        if i <= len(region_list) and n_zones > 2 * len(region_list):
            region = region_list[i - 1]
            city = CITIES[region][0]
            z = Zone(f"{region}-hub", region, city, "hub")
            hubs[region] = z
        else:
            region = rng.choices(region_list, weights)[0]
            city = rng.choice(CITIES[region])
            r = rng.random()
            kind = "office" if r < 0.08 else ("isp" if r < 0.75 else "metro")
            if kind == "office":
                base = "office"
            elif kind == "isp":
                base = f"{city[3].lower()}-{rng.choice(ISPS)}"
            else:
                base = f"{region}-{city[0]}"
            counters[base] = counters.get(base, 0) + 1
            name = f"{base}-{counters[base]}"
            z = Zone(name, region, city, kind)
        assert z.name not in used_names, z.name
        used_names.add(z.name)
        zones.append(z)

    # Fallback chains: metro/isp → region hub (or another zone of the
    # region), hub → global, office → another office or hub; a few
    # explicit `none`/null, and a few two-zone cycles (allowed: docs/configuration.md).
    by_region: dict[str, list[Zone]] = {r: [] for r in region_list}
    offices = []
    for z in zones[1:]:
        by_region[z.region].append(z)
        if z.kind == "office":
            offices.append(z)
    zones[0].fallback_style = rng.choice(["null", "none", "omit"])
    for z in zones[1:]:
        r = rng.random()
        if z.kind == "hub":
            z.fallback = "global"
        elif r < 0.05:
            z.fallback_style = rng.choice(["none", "null", "omit", "tilde"])
            continue
        elif z.kind == "office" and len(offices) > 1 and r < 0.6:
            other = rng.choice(offices)
            z.fallback = other.name if other is not z else (hubs.get(z.region) or zones[0]).name
        elif r < 0.75 and z.region in hubs:
            z.fallback = hubs[z.region].name
        elif r < 0.9:
            other = rng.choice(by_region[z.region])
            z.fallback = other.name if other is not z else "global"
        else:
            z.fallback = "global"
        z.fallback_style = "name"
    # A few deliberate cycles between sibling zones (eu → us → eu style).
    siblings = [z for z in zones[1:] if z.kind in ("isp", "metro")]
    for _ in range(max(1, len(siblings) // 100)):
        if len(siblings) < 2:
            break
        a, b = rng.sample(siblings, 2)
        a.fallback, b.fallback = b.name, a.name
        a.fallback_style = b.fallback_style = "name"

    # Routes. Each zone gets its own /16 blocks (disjoint between zones),
    # and its own IPv6 /32 (or a ULA /40 for offices).
    v4_pool = [(o << 24) | (b << 16) for o in V4_FIRST_OCTETS for b in range(256)]
    private_pool = [(10 << 24) | (b << 16) for b in range(256)] + \
                   [(172 << 24) | (b << 16) for b in range(16, 32)]
    rng.shuffle(v4_pool)
    rng.shuffle(private_pool)
    v6_pool = rng.sample(range(0x2A000000, 0x2A100000), n_zones)  # /32 prefixes in 2a00::/12
    ula_pool = rng.sample(range(1 << 32), n_zones)  # fdXX:XXXX:XX00::/40 per office zone
    v4_next = 0
    priv_next = 0
    all_routes: set[str] = set()

    for zi, z in enumerate(zones):
        target = n_routes
        if z.kind == "global" and n_routes >= 2:
            z.routes.append(("0.0.0.0/0", "catch-all: viewers outside every other route"))
            z.routes.append(("::/0", None))
            target -= 2
        if target <= 0:
            continue
        n6 = max(1, round(target * rng.uniform(0.05, 0.25))) if target >= 4 else 0
        n4 = target - n6
        office = z.kind == "office"
        blocks4: list[Block] = []
        need_blocks = max(1, (n4 + 39) // 40)
        for _ in range(need_blocks):
            if office and priv_next < len(private_pool):
                blocks4.append(Block(private_pool[priv_next], 16, 32))
                priv_next += 1
            else:
                blocks4.append(Block(v4_pool[v4_next], 16, 32))
                v4_next += 1
        if office:
            block6 = Block(((0xFD << 32) | ula_pool[zi]) << 88, 40, 128)
        else:
            block6 = Block(v6_pool[zi] << 96, 32, 128)
        made: list[tuple[int, int, int]] = []  # (family, start, plen) for more-specifics
        out: list[str] = []

        def add(cidr: str):
            if cidr in all_routes:
                return False
            all_routes.add(cidr)
            out.append(cidr)
            return True

        k = 0
        while len(out) < n4:
            # 1 in 40: a more specific route inside one of our own routes.
            if made and rng.random() < 0.025:
                fam, start, plen = rng.choice(made)
                if fam == 4 and plen <= 28:
                    sub = plen + rng.randint(1, 4)
                    size = 1 << (32 - sub)
                    s = start + rng.randrange(1 << (sub - plen)) * size
                    add(v4(s, sub))
                    continue
            plen = weighted(rng, V4_LEN_WEIGHTS)
            if office and plen < 20:
                plen = 24
            slot = k % len(blocks4)
            block = blocks4[slot]
            k += 1
            start = None
            for want in (plen, 24, 28):
                start = block.try_alloc(rng, want)
                if start is not None:
                    plen = want
                    break
            if start is None:
                # Crowded block: retire it and take a fresh one.
                blocks4[slot] = Block(v4_pool[v4_next], 16, 32)
                v4_next += 1
                continue
            if add(v4(start, plen)):
                made.append((4, start, plen))
        n_out4 = len(out)
        while len(out) - n_out4 < n6:
            plen = weighted(rng, V6_LEN_WEIGHTS)
            if office:
                plen = max(plen, 48)
            start = block6.try_alloc(rng, plen)
            if start is None:
                continue
            add(v6(start, plen))
        # Interleave families a little, as people write them.
        if rng.random() < 0.5:
            rng.shuffle(out)
        else:
            out.sort(key=lambda c: (":" in c, c))
        for cidr in out:
            comment = None
            if rng.random() < 0.08:
                comment = rng.choice([
                    f"{rng.choice(ISPS).capitalize()} {z.city[0].upper()}",
                    f"AS{rng.randint(1000, 399999)}",
                    f"{z.city[0].upper()} metro",
                    "mobile",
                    "broadband",
                    "added after traffic review",
                    "peering LAN",
                ])
            z.routes.append((cidr, comment))
        if rng.random() < 0.3:
            z.comment = rng.choice([
                f"Viewers of {z.city[0].upper()} ({z.region}).",
                f"{z.kind.capitalize()} zone, region {z.region}.",
                "Prefixes from the ISP's published route objects.",
                "Keep prefixes sorted when editing by hand.",
            ])
    return zones


class NodeSpec:
    __slots__ = ("name", "roles", "region", "zone", "city")

    def __init__(self, name, roles, region, zone, city):
        self.name, self.roles, self.region, self.zone, self.city = name, roles, region, zone, city


def routers_for(n_nodes: int) -> int:
    """Unzoned router nodes: about 1 in 25, at least one per region."""
    return max(len(REGIONS), n_nodes // 25) if n_nodes >= 2 * len(REGIONS) else min(1, n_nodes)


def nodes_needed(routed_zones: int) -> int:
    """The fewest nodes that give every routed zone a node."""
    n = routed_zones
    while n - routers_for(n) < routed_zones:
        n += 1
    return n


def plan_nodes(rng: random.Random, n_nodes: int, zones: list[Zone], used_names: set[str]):
    """Roles, region and zone of every node: one per routed zone first."""
    specs: list[NodeSpec] = []
    city_count: dict[str, int] = {}
    n_routers = routers_for(n_nodes)
    n_zoned = n_nodes - n_routers

    def name_for(prefix: str, city: str) -> str:
        key = f"{prefix}-{city}"
        city_count[key] = city_count.get(key, 0) + 1
        name = f"{key}-{city_count[key]}"
        assert name not in used_names
        used_names.add(name)
        return name

    def roles_for(z: Zone):
        r = rng.random()
        if z.kind == "office":
            return rng.choice([["ingest"], ["edge", "ingest"], ["edge"]])
        if r < 0.78:
            return ["edge"]
        if r < 0.86:
            return ["edge", "ingest"]
        if r < 0.92:
            return ["ingest"]
        if r < 0.97:
            return ["origin"]
        return ["ingest", "origin"]

    routed = [z for z in zones if z.routes]
    order = routed[:n_zoned]
    extra = n_zoned - len(order)
    if extra > 0:
        # Bigger zones (hubs, global) get more nodes.
        pool = [z for z in zones if z.kind in ("global", "hub")] * 4 + zones
        order += [rng.choice(pool) for _ in range(extra)]
    for z in order:
        roles = roles_for(z)
        city = z.city if rng.random() < 0.8 else rng.choice(CITIES[z.region])
        prefix = {"edge": "edge", "ingest": "ingest", "origin": "origin"}[roles[0]]
        if roles == ["edge", "ingest"]:
            prefix = "streamer"
        specs.append(NodeSpec(name_for(prefix, city[0]), roles, z.region, z, city))
        z.nodes += 1
    for i in range(n_routers):
        region = REGIONS[i % len(REGIONS)]
        city = rng.choice(CITIES[region])
        specs.append(NodeSpec(name_for("router", city[0]), ["router"], region, None, city))
    missing = sum(1 for z in routed if z.nodes == 0)
    return specs, missing


# ------------------------------------------------------------- writers

def write_cluster(rng: random.Random) -> str:
    proxies = ["192.0.2.10/32", "192.0.2.11/32", "198.51.100.0/28", "2001:db8::10/128", "2001:db8:ffff::/48"]
    return "\n".join([
        "# yaml-language-server: $schema=schemas/cluster.schema.json",
        "# Synthetic benchmark cluster (bench/gen_repo.py).",
        "name: bench-cdn",
        "",
        "# One trusted proxy hop: load balancers in front of the routers.",
        "trusted_proxies:",
        *[f"  - {p}" for p in proxies],
        "",
        "mqtt:",
        "  url: mqtts://mqtt.bench.example.net:8883",
        "  topic_prefix: edgeform/bench",
        "",
        "apply:",
        "  max_delete_percent: 25",
        "  max_change_percent: 50",
        "  min_keys: 10",
        "",
        "geo:",
        "  tie_km: 100",
        "  buckets:",
        "    - { below_km: 500, weight: 10 }",
        "    - { below_km: 2000, weight: 7 }",
        "    - { below_km: 5000, weight: 4 }",
        "  default_weight: 1",
        "  max_fails: 3",
        "  fail_timeout: 30s",
        "",
    ])


def write_zone(rng: random.Random, z: Zone) -> str:
    lines = ["# yaml-language-server: $schema=../schemas/zone.schema.json"]
    if z.kind == "global":
        lines += ["# The catch-all: once any zone has a route, viewers outside every",
                  "# route are refused, so 0.0.0.0/0 and ::/0 live here."]
    elif z.comment:
        lines.append(f"# {z.comment}")
    lines.append(f"name: {z.name}")
    if z.routes:
        lines.append("routes:")
        width = max(len(c) for c, _ in z.routes) + 2
        for cidr, comment in z.routes:
            lines.append(f"  - {cidr.ljust(width)}# {comment}" if comment else f"  - {cidr}")
    else:
        lines.append("routes: []")
    style = z.fallback_style
    if style == "name":
        if rng.random() < 0.1:
            lines.append("# When every node here is unavailable:")
        lines.append(f"fallback: {z.fallback}")
    elif style == "none":
        lines.append("fallback: none")
    elif style == "null":
        lines.append("fallback: null")
    elif style == "tilde":
        lines.append("fallback: ~")
    lines.append("")
    return "\n".join(lines)


class AddressPool:
    def __init__(self):
        self.v4 = int(ipaddress.IPv4Address("198.18.0.10"))
        self.v6 = (0x20010DB8_00010001 << 64) | 0x10
        self.priv = int(ipaddress.IPv4Address("10.250.0.10"))

    def next_v4(self) -> str:
        a = self.v4
        self.v4 += 1 if (self.v4 & 0xFF) < 250 else 16
        return v4(a)

    def next_priv(self) -> str:
        a = self.priv
        self.priv += 1 if (self.priv & 0xFF) < 250 else 16
        return v4(a)

    def next_v6(self) -> str:
        a = self.v6
        self.v6 += 1 << 64  # 2001:db8:1:1::10, 2001:db8:1:2::10, …
        return v6(a)


def write_node(rng: random.Random, spec: NodeSpec, addrs: AddressPool, redis_port: list[int]) -> str:
    roles = spec.roles
    edge = "edge" in roles
    router = "router" in roles
    city, lat, lon, _cc = spec.city
    lines = ["# yaml-language-server: $schema=../schemas/node.schema.json"]
    if rng.random() < 0.15:
        lines.append(rng.choice([
            "# Reached through its own Sentinel: the master is resolved before every push.",
            f"# Rack {rng.randint(1, 40)}, {city.upper()} {rng.choice(['DC1', 'DC2', 'POP-A', 'POP-B'])}.",
            "# Hardware refresh planned; limits lowered until then.",
            "# Takes streams in from the encoders.",
        ]))
    lines.append(f"name: {spec.name}")
    lines.append(f"roles: {flow(roles)}" if rng.random() < 0.8 else "roles:\n" + "\n".join(f"  - {r}" for r in roles))
    lines.append(f"region: {spec.region}")
    if spec.zone is not None:
        lines.append(f"zone: {spec.zone.name}")
    if not router and rng.random() < 0.8:
        host = spec.name.split("-", 1)[1]
        lines.append(f"public_url: https://{host}.{rng.choice(['edge', 'stream', 'media'])}.bench-cdn.example.net")
    if edge or router or rng.random() < 0.3:
        la = round(lat + rng.uniform(-0.3, 0.3), 4)
        lo = round(lon + rng.uniform(-0.3, 0.3), 4)
        if rng.random() < 0.7:
            lines.append(f"location: {{ lat: {la:.4f}, lon: {lo:.4f} }}")
        else:
            lines += ["location:", f"  lat: {la:.4f}", f"  lon: {lo:.4f}"]
    office = spec.zone is not None and spec.zone.kind == "office"
    a4 = addrs.next_priv() if office else addrs.next_v4()
    addresses = [a4]
    r = rng.random()
    if r < 0.6:
        addresses.append(addrs.next_v6())
    if r < 0.1:
        addresses.append(addrs.next_v4())
    if rng.random() < 0.6:
        lines.append(f"addresses: {flow(addresses)}")
    else:
        lines.append("addresses:")
        lines += [f"  - {a}" for a in addresses]
    if edge or rng.random() < 0.5:
        redis_port[0] += 1
        r = rng.random()
        if r < 0.55:
            lines += ["redis:", f"  url: redis://{a4}:6379" if rng.random() < 0.7 else
                      f"  url: redis://127.0.0.1:{redis_port[0]}/{rng.randint(0, 3)}"]
        elif r < 0.7:
            lines += ["redis:", f"  url: rediss://{a4}:6380"]
        else:
            n = rng.randint(1, 3)
            sentinels = [f'"{a4}:{26379 + i}"' for i in range(n)]
            lines += ["redis:", f"  sentinels: {flow(sentinels)}", f"  master: {spec.name}"]
        if rng.random() < 0.4:
            lines.append(f"  password_env: {rng.choice(REDIS_PASSWORD_ENVS)}")
    if roles == ["ingest"] and rng.random() < 0.5:
        lines.append("playback_session_limit: 0   # takes streams in, never serves viewers")
    elif rng.random() < 0.7:
        lines.append(f"playback_session_limit: {rng.choice([100, 200, 300, 500, 1000, 1500, 2000, 3000, 5000])}")
    if edge and rng.random() < 0.5:
        lines.append(f"playback_bandwidth_kbit: {rng.choice([1, 2, 5, 9, 10, 20, 40]) * 1_000_000}")
    if rng.random() < 0.4:
        lines.append(f"network_bandwidth_kbit: {rng.choice([1, 10, 25, 40, 100]) * 1_000_000}")
    if edge and rng.random() < 0.6:
        dirs = rng.sample(["static", "dynamic", "api", "perma", "video", "images", "hot", "cold"], rng.randint(1, 4))
        lines += ["cache:", "  dirs:"]
        lines += [f"    - /var/cache/nginx/{d}" for d in dirs]
        lines.append(f'  levels: "{rng.choice(["1:2", "1:2", "2:2", "1:1:2", "2"])}"')
        if rng.random() < 0.5:
            lines.append(f"  key: {rng.choice(['$scheme://$host$request_uri', '$host$uri$is_args$args', '$scheme://$host$uri'])}")
    lines.append("")
    return "\n".join(lines)


class HostNames:
    """Unique lower-case hostnames across hosts and aliases."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def claim(self, name: str) -> bool:
        if name in self.used or len(name) > 253:
            return False
        self.used.add(name)
        return True

    def brand(self) -> str:
        rng = self.rng
        a, n = rng.choice(ADJ), rng.choice(NOUN)
        r = rng.random()
        if r < 0.55:
            return f"{a}{n}"
        if r < 0.8:
            return f"{a}-{n}"
        if r < 0.9:
            return f"{n}{rng.randint(2, 999)}"
        return f"{a}{n}{rng.randint(1, 99)}"

    def host(self) -> tuple[str, str]:
        """(host, registered domain)."""
        rng = self.rng
        while True:
            domain = f"{self.brand()}.{rng.choice(TLDS)}"
            r = rng.random()
            if r < 0.02:
                host = f"*.{rng.choice(['cdn', 'tenants', 'users', 'sites', 'apps'])}.{domain}"
            elif r < 0.45:
                host = f"{rng.choice(SUBS)}.{domain}"
            else:
                host = domain
            if self.claim(host):
                return host, domain


def site_filename(host: str) -> str:
    return host.replace("*", "wildcard") + ".yaml"


def write_site(rng: random.Random, names: HostNames, regions: list[str]) -> tuple[str, str, int]:
    host, domain = names.host()
    lines = ["# yaml-language-server: $schema=../schemas/site.schema.json"]
    r = rng.random()
    if r < 0.25:
        lines.append(f"# {rng.choice(WORDS_FOR_COMMENTS['site'])}.")
    elif r < 0.3:
        lines.append(f"# Ticket OPS-{rng.randint(100, 99999)}: owner {rng.choice(NOUN)}-team.")
    lines.append(f'host: "{host}"' if host.startswith("*") else f"host: {host}")

    # Aliases.
    aliases = []
    r = rng.random()
    if not host.startswith("*") and r < 0.6:
        if host == domain and names.claim(f"www.{domain}"):
            aliases.append(f"www.{domain}")
        for _ in range(rng.choice([0, 0, 0, 1, 1, 2])):
            sub = rng.choice(ALIAS_SUBS)
            cand = f"{sub}.{host}" if rng.random() < 0.3 else f"{sub}.{domain}"
            if cand != host and names.claim(cand):
                aliases.append(cand)
        if rng.random() < 0.05:
            cand = f"*.{rng.choice(['tenants', 'u', 'preview'])}.{domain}"
            if names.claim(cand):
                aliases.append(cand)
    if aliases:
        if len(aliases) == 1 and rng.random() < 0.5:
            lines.append(f"aliases: {flow(q(a) for a in aliases)}")
        else:
            lines.append("aliases:")
            lines += [f"  - {q(a)}" for a in aliases]

    # Origin: scheme://host[:port], never a path.
    r = rng.random()
    if r < 0.45:
        origin = f"https://{rng.choice(ORIGIN_KINDS)}.{domain}"
    elif r < 0.65:
        origin = f"https://{rng.choice(ORIGIN_KINDS)}.{domain}:{rng.choice([8443, 8443, 9443, 4443, 443])}"
    elif r < 0.85:
        ip = f"{rng.choice([203, 198, 192])}.{rng.choice([0, 51, 168])}.{rng.randint(0, 255)}.{rng.randint(1, 254)}"
        origin = f"http://{ip}:{rng.choice([80, 8080, 8000, 3000])}" if rng.random() < 0.6 else f"https://{ip}"
    elif r < 0.95:
        origin = f"http://{rng.choice(ORIGIN_KINDS)}-{rng.randint(1, 9)}.internal.{domain}:{rng.choice([80, 8080])}"
    else:
        origin = f"https://[2001:db8:{rng.randint(1, 0xffff):x}::{rng.randint(1, 0xffff):x}]:8443"
    lines.append(f"origin: {origin}")

    kind = rng.random()  # rough site profile
    api = kind < 0.1
    video = 0.1 <= kind < 0.3
    if api or rng.random() < 0.03:
        lines.append("cached: false")
    elif rng.random() < 0.15:
        lines.append("cached: true")
    if rng.random() < 0.03:
        lines.append("suspended: true")
    elif rng.random() < 0.02:
        lines.append("suspended: false")

    if rng.random() < 0.3:
        k = rng.randint(1, min(3, len(regions)))
        picked = sorted(rng.sample(regions, k), key=regions.index)
        lines.append(f"regions: {flow(picked)}" if rng.random() < 0.8 else "regions:\n" + "\n".join(f"  - {x}" for x in picked))

    # Geo policy.
    r = rng.random()
    if r < 0.08:
        codes = rng.sample(BLOCKED_USUALLY, rng.randint(1, 5))
        if rng.random() < 0.3:
            codes += [c for c in rng.sample(COUNTRIES, 3) if c not in codes]
        lines += ["geo_mode: block", f"geo_codes: {flow(codes)}"]
    elif r < 0.16:
        market = MARKETS[rng.choice(REGIONS)]
        codes = rng.sample(market, rng.randint(1, len(market)))
        if len(codes) > 6 and rng.random() < 0.5:
            lines += ["geo_mode: allow", "geo_codes:"] + [f"  - {c}" for c in codes]
        else:
            lines += ["geo_mode: allow", f"geo_codes: {flow(codes)}"]
    elif r < 0.2:
        lines.append("geo_mode: off")

    # Address policy.
    r = rng.random()
    if r < 0.07:
        mode = "allow" if rng.random() < 0.4 else "block"
        nets: list[str] = []
        seen: set[str] = set()
        for _ in range(rng.randint(1, 8)):
            f = rng.random()
            if f < 0.6:
                plen = rng.choice([8, 12, 16, 20, 22, 24, 24, 24, 28, 32])
                addr = rng.getrandbits(32) & ~((1 << (32 - plen)) - 1) & 0xFFFFFFFF
                text = v4(addr) if plen == 32 and rng.random() < 0.5 else v4(addr, plen)
                norm = v4(addr, plen)
            else:
                plen = rng.choice([32, 40, 48, 48, 56, 64, 128])
                addr = (0x2000 << 112 | rng.getrandbits(125)) & ~((1 << (128 - plen)) - 1)
                text = v6(addr) if plen == 128 and rng.random() < 0.5 else v6(addr, plen)
                norm = v6(addr, plen)
            if norm not in seen:
                seen.add(norm)
                nets.append(text)
        lines.append(f"ip_mode: {mode}")
        if len(nets) <= 2 and rng.random() < 0.5:
            lines.append(f"ip_list: {flow(nets)}")
        else:
            lines.append("ip_list:")
            for i, n in enumerate(nets):
                if i == 0 and rng.random() < 0.2:
                    lines.append(f"  - {n}    # {rng.choice(['office', 'VPN', 'partner', 'scanner', 'abuse'])}")
                else:
                    lines.append(f"  - {n}")

    for key, choices, p in (("rate_mode", ["normal", "strict", "off"], 0.35),
                            ("waf_mode", ["detect", "strict", "off"], 0.4),
                            ("cors_mode", ["permissive", "strict", "off"], 0.25),
                            ("hotlink_mode", ["block", "off"], 0.15)):
        if api and key in ("rate_mode", "cors_mode"):
            lines.append(f"{key}: strict")
        elif rng.random() < p:
            lines.append(f"{key}: {rng.choice(choices)}")

    # Cache rules: a few, in an order that makes sense (specific first).
    n = 0 if api else rng.choice([0, 0, 1, 1, 2, 2, 3, 4, 5, 6])
    if video and n == 0:
        n = 2
    if n:
        pool = CACHE_RULES
        if video:
            pool = [r for r in CACHE_RULES if r[1] in (".ts", ".m3u8", ".mp4", ".m4s", ".mpd", ".vtt", "/live/",
                                                       "/hls/", "/vod/", "/live/playlist.m3u8")
                    or "chunk_" in r[1] or "m3u8" in r[1]] * 3 + CACHE_RULES
        rules = []
        for _ in range(n):
            rule = rng.choice(pool)
            if rule not in rules:
                rules.append(rule)
        lines.append("cache_rules:")
        for mt, mv, policy in rules:
            if rng.random() < 0.05:  # operators disagree with defaults
                policy = rng.choice(["long", "medium", "short", "bypass"])
            lines += [f"  - match_type: {mt}", f"    match_value: {q(mv)}"]
            if policy == "bypass":
                lines.append("    action: bypass")
            else:
                lines += ["    action: ttl", f"    ttl: {rng.choice(TTLS[policy])}"]

    # Edge rules.
    n = rng.choice([0, 0, 0, 0, 1, 1, 2, 3])
    if n:
        plain_host = host[2:] if host.startswith("*.") else host
        rules = []
        for _ in range(n):
            rule = rng.choice(EDGE_RULES)
            if rule not in rules:
                rules.append(rule)
        lines.append("edge_rules:")
        for mt, mv, action, target in rules:
            lines += [f"  - match_type: {mt}", f"    match_value: {q(mv)}", f"    action: {action}"]
            if action == "redirect":
                lines.append(f"    redirect_status: {rng.choice([301, 301, 302, 307, 308])}")
                if target is not None:
                    lines.append("    redirect_to: " + q(target.format(
                        host=plain_host, domain=domain, shop=f"shop.{domain}", blog=f"blog.{domain}")))
    lines.append("")
    return host, "\n".join(lines), len(aliases)


# ----------------------------------------------------------------- main

def generate(out: Path, seed: int, n_sites: int, n_zones: int, n_routes: int, n_nodes: int,
             quiet: bool = False) -> dict:
    t0 = time.perf_counter()
    if n_zones < 1:
        raise SystemExit("--zones must be at least 1")
    rng = random.Random(seed)
    # Independent streams per section: changing one count leaves the others.
    rng_zones = random.Random(rng.getrandbits(64))
    rng_nodes = random.Random(rng.getrandbits(64))
    rng_sites = random.Random(rng.getrandbits(64))

    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    for d in ("sites", "zones", "nodes"):
        (tmp / d).mkdir(parents=True)

    (tmp / "cluster.yaml").write_text(write_cluster(rng), encoding="utf-8")

    names: set[str] = set()
    zones = make_zones(rng_zones, n_zones, n_routes, names)
    for z in zones:
        (tmp / "zones" / f"{z.name}.yaml").write_text(write_zone(rng_zones, z), encoding="utf-8")

    node_names: set[str] = set()
    specs, empty_zones = plan_nodes(rng_nodes, n_nodes, zones, node_names)
    addrs = AddressPool()
    redis_port = [6400]
    for spec in specs:
        (tmp / "nodes" / f"{spec.name}.yaml").write_text(
            write_node(rng_nodes, spec, addrs, redis_port), encoding="utf-8")
    node_regions = [r for r in REGIONS if any(s.region == r for s in specs)]

    hostnames = HostNames(rng_sites)
    sites_dir = tmp / "sites"
    files_seen: set[str] = set()
    n_aliases = 0
    for _ in range(n_sites):
        host, text, k = write_site(rng_sites, hostnames, node_regions or ["eu"])
        n_aliases += k
        fname = site_filename(host)
        assert fname not in files_seen, fname
        files_seen.add(fname)
        with open(sites_dir / fname, "w", encoding="utf-8") as f:
            f.write(text)

    elapsed = time.perf_counter() - t0
    stamp = {
        "generator_version": GENERATOR_VERSION,
        "params": {"seed": seed, "sites": n_sites, "zones": n_zones, "routes": n_routes, "nodes": n_nodes},
        "counts": {
            "sites": n_sites,
            "aliases": n_aliases,
            "zones": len(zones),
            "routes": sum(len(z.routes) for z in zones),
            "nodes": len(specs),
            "routers": sum(1 for s in specs if s.zone is None),
            "zones_without_nodes": empty_zones,
        },
        "generate_seconds": round(elapsed, 3),
    }
    (tmp / ".gen.json").write_text(json.dumps(stamp, indent=2) + "\n", encoding="utf-8")
    if out.exists():
        if not (out / ".gen.json").exists():
            shutil.rmtree(tmp)
            raise SystemExit(f"{out} exists and was not made by gen_repo.py (no .gen.json); refusing to replace it")
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    if not quiet:
        c = stamp["counts"]
        print(f"generated {out}: {c['sites']} sites ({c['aliases']} aliases), {c['zones']} zones, "
              f"{c['routes']} routes, {c['nodes']} nodes ({c['routers']} routers) in {elapsed:.1f} s",
              file=sys.stderr)
        if empty_zones:
            print(f"note: {empty_zones} zone(s) with routes have no node (a node serves one zone; "
                  f"use --nodes >= {nodes_needed(sum(1 for z in zones if z.routes))}); "
                  f"`edgeform check` will print as many `empty-zone` warnings", file=sys.stderr)
    return stamp


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / ".bench" / "synthetic",
                    help="output folder, replaced if it holds an earlier output (default .bench/synthetic)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--sites", type=int, default=100_000)
    ap.add_argument("--zones", type=int, default=1_000)
    ap.add_argument("--routes", type=int, default=100, help="routes per zone")
    ap.add_argument("--nodes", type=int, default=1_200,
                    help="nodes; needs > zones for every routed zone to have a node (default 1200)")
    ap.add_argument("-q", "--quiet", action="store_true")
    args = ap.parse_args(argv)
    generate(args.out, args.seed, args.sites, args.zones, args.routes, args.nodes, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
