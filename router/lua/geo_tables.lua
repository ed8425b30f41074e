-- Generated from the Rust definitions in edgestate (edgestate/src/lua.rs):
-- do not edit. `EDGEFORM_BLESS=1 cargo test -p edgestate lua` rewrites it.
-- The geo router's constants: edgestate::route and edgestate::routing.

return {
  -- The mean Earth radius of the haversine distance.
  EARTH_RADIUS_KM = 6371.0088,
  -- stable_hash: FNV-1a's offset basis and prime, SplitMix64's multipliers.
  HASH_OFFSET = 0xcbf29ce484222325ULL,
  HASH_PRIME = 0x100000001b3ULL,
  HASH_MIX1 = 0xbf58476d1ce4e5b9ULL,
  HASH_MIX2 = 0x94d049bb133111ebULL,
  -- Edges within this many km of the nearest are tied (a table without geo).
  DEFAULT_TIE_KM = 100.0,
  -- Retry-After (seconds) of a 503 without an online edge.
  RETRY_AFTER = 5,
}
