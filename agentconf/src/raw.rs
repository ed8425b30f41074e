//! `agent.yaml` as written: serde structs over the spanned tree's JSON.
//!
//! Every value is a [`Field`]: the typed value, or why it is not one. A
//! wrong type or an unknown key therefore never stops the reading; the
//! validation ([`crate::check`]) reports each at its place (the tree gives
//! the position of every JSON pointer) and goes on with the rest, so one
//! run lists every problem.
//!
//! The keys a section allows are its struct's fields, as serde's derive
//! lists them: an unknown key is reported with that list, so a key added
//! here is known everywhere at once.

use std::collections::BTreeMap;

use serde::de::{self, Deserialize, DeserializeOwned, Deserializer, Visitor};
use serde_json::Value;

/// A value as written: its typed form, or the type error; for a mapping,
/// also the keys it has that its struct does not know.
#[derive(Debug, Clone)]
pub struct Field<T> {
    pub value: Result<T, String>,
    /// Keys of the mapping its struct does not have, in the file's order.
    pub unknown: Vec<String>,
    /// The keys its struct has (empty unless `T` is a struct).
    pub expected: &'static [&'static str],
}

impl<T> Field<T> {
    /// The typed value, if it is one.
    #[must_use]
    pub fn ok(&self) -> Option<&T> {
        self.value.as_ref().ok()
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let shape = shape::<T>();
        let expected = match shape {
            Shape::Struct(fields) => fields,
            _ => &[],
        };
        let unknown = match (&v, shape) {
            (Value::Object(m), Shape::Struct(fields)) => m
                .keys()
                .filter(|k| !fields.contains(&k.as_str()))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        let wanted = match shape {
            Shape::String => Some(("a string", v.is_string())),
            Shape::Bool => Some(("a boolean", v.is_boolean())),
            Shape::Seq => Some(("a sequence", v.is_array())),
            // A struct is never read from a sequence (serde's derive
            // would take one positionally).
            Shape::Map | Shape::Struct(_) => Some(("a mapping", v.is_object())),
            Shape::Other => None,
        };
        let value = match wanted {
            Some((what, false)) => Err(format!("invalid type: {}, expected {what}", kind(&v))),
            _ => T::deserialize(v).map_err(|e| e.to_string()),
        };
        Ok(Field {
            value,
            unknown,
            expected,
        })
    }
}

/// For a section that is a mapping when present: `key:` with nothing
/// after it (null) is refused as not a mapping, never taken as absent.
fn present<'de, D, T>(d: D) -> Result<Option<Field<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Field::deserialize(d).map(Some)
}

/// What a value reads as, in the words of the error messages.
#[must_use]
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a sequence",
        Value::Object(_) => "a mapping",
    }
}

/// What `T` deserializes from, found by asking its `Deserialize` (the
/// struct's field list comes from serde's derive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    String,
    Bool,
    Seq,
    Map,
    Struct(&'static [&'static str]),
    Other,
}

fn shape<T: DeserializeOwned>() -> Shape {
    let mut found = Shape::Other;
    let _ = T::deserialize(Probe(&mut found));
    found
}

/// A deserializer that only records which kind of value it was asked for.
struct Probe<'a>(&'a mut Shape);

impl Probe<'_> {
    fn found<V>(self, shape: Shape) -> Result<V, de::value::Error> {
        *self.0 = shape;
        Err(de::Error::custom("probe"))
    }
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.found(Shape::Other)
    }
    fn deserialize_str<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.found(Shape::String)
    }
    fn deserialize_string<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.found(Shape::String)
    }
    fn deserialize_bool<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.found(Shape::Bool)
    }
    fn deserialize_seq<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.found(Shape::Seq)
    }
    fn deserialize_map<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        self.found(Shape::Map)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.found(Shape::Struct(fields))
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char bytes byte_buf
        option unit unit_struct newtype_struct tuple tuple_struct enum
        identifier ignored_any
    }
}

/// A string value.
pub type Text = Option<Field<String>>;

/// The whole file.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Config {
    pub node: Text,
    pub region: Text,
    #[serde(default, deserialize_with = "present")]
    pub redis: Option<Field<Redis>>,
    #[serde(default, deserialize_with = "present")]
    pub cache: Option<Field<Cache>>,
    #[serde(default, deserialize_with = "present")]
    pub http: Option<Field<Http>>,
    #[serde(default, deserialize_with = "present")]
    pub routing: Option<Field<Routing>>,
    #[serde(default, deserialize_with = "present")]
    pub mqtt: Option<Field<Mqtt>>,
    #[serde(default, deserialize_with = "present")]
    pub health: Option<Field<Health>>,
    #[serde(default, deserialize_with = "present")]
    pub actions: Option<Field<BTreeMap<String, Field<Action>>>>,
    #[serde(default, deserialize_with = "present")]
    pub metrics: Option<Field<Metrics>>,
    pub state_dir: Text,
}

/// `redis:` — by URL or through Sentinels.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Redis {
    pub url: Text,
    pub sentinels: Option<Field<Vec<Field<String>>>>,
    pub master: Text,
    pub username: Text,
    pub password_env: Text,
    #[serde(default, deserialize_with = "present")]
    pub tls: Option<Field<RedisTls>>,
}

/// `redis.tls:`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct RedisTls {
    pub ca_file: Text,
    pub cert_file: Text,
    pub key_file: Text,
}

/// `cache:` — the nginx cache purges clean.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Cache {
    pub dirs: Option<Field<Vec<Field<String>>>>,
    pub levels: Text,
    pub key: Text,
}

/// `http:` — the listener.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Http {
    pub listen: Text,
    pub proxy_url: Text,
    pub metrics: Option<Field<bool>>,
}

/// `routing:`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Routing {
    pub health_file: Text,
    pub refresh: Text,
    pub share_health: Text,
}

/// `mqtt:` — the broker.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Mqtt {
    pub url: Text,
    pub topic_prefix: Text,
    pub username: Text,
    pub password_env: Text,
    pub ca_file: Text,
    pub command_key_env: Text,
    pub command_public_key_file: Text,
    pub result_key_file: Text,
}

/// `health:` — the report.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Health {
    pub interval: Text,
    #[serde(default, deserialize_with = "present")]
    pub play_sessions: Option<Field<Source>>,
    #[serde(default, deserialize_with = "present")]
    pub streams: Option<Field<Source>>,
    pub bundle_manifest: Text,
    #[serde(default, deserialize_with = "present")]
    pub vod: Option<Field<Source>>,
    pub probe: Option<Field<Vec<Field<String>>>>,
    pub edge_metrics: Text,
}

/// One metric source of `health:`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Source {
    pub url: Text,
    pub file: Text,
    pub field: Text,
}

/// One entry of `actions:`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Action {
    pub argv: Option<Field<Vec<Field<String>>>>,
    #[serde(default, deserialize_with = "present")]
    pub args: Option<Field<BTreeMap<String, Field<String>>>>,
    pub timeout: Text,
}

/// `metrics:` — the separate `/metrics` listener.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Metrics {
    pub listen: Text,
}
