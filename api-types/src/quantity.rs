//! Sizes (`4GiB`, `512MiB`, `20G`, `1000`) and CPU amounts (`2`, `500m`, `1.5`).
//!
//! Both keep the text the user wrote, so a stored spec shows `4GiB` rather than a byte count,
//! and compare by value, so `4Gi` and `4GiB` are the same size.
//!
//! `scalar` reads the strings that YAML users write as bare numbers (`memory: 1000`): one
//! visitor for every such field.

use std::borrow::Cow;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A size in bytes. Binary units (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`, optionally followed by
/// `B`) are powers of 1024; decimal units (`k`, `M`, `G`, `T`, `P`, `E`, optionally followed by
/// `B`) are powers of 1000; a bare number is bytes.
#[derive(Debug, Clone)]
pub struct Quantity {
    bytes: u64,
    text: String,
}

/// The text did not parse as a size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a quantity")]
pub struct QuantityError(pub String);

/// Pattern of the JSON Schema for sizes; `FromStr` is the authority.
pub const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?([kKMGTPE]B?|[KMGTPE]iB?|B)?$";

const SIZE_UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("B", 1),
    ("k", 1_000),
    ("K", 1_000),
    ("kB", 1_000),
    ("KB", 1_000),
    ("M", 1_000_000),
    ("MB", 1_000_000),
    ("G", 1_000_000_000),
    ("GB", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("TB", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("PB", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
    ("EB", 1_000_000_000_000_000_000),
    ("Ki", 1 << 10),
    ("KiB", 1 << 10),
    ("Mi", 1 << 20),
    ("MiB", 1 << 20),
    ("Gi", 1 << 30),
    ("GiB", 1 << 30),
    ("Ti", 1 << 40),
    ("TiB", 1 << 40),
    ("Pi", 1 << 50),
    ("PiB", 1 << 50),
    ("Ei", 1 << 60),
    ("EiB", 1 << 60),
];

/// Splits `"1.5GiB"` into `("1", "5", "GiB")`; `None` when the number part is malformed.
fn split_number(s: &str) -> Option<(&str, &str, &str)> {
    let number_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(number_end);
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => {
            if f.is_empty() || f.contains('.') {
                return None;
            }
            (w, f)
        }
        None => (number, ""),
    };
    if whole.is_empty() {
        return None;
    }
    Some((whole, frac, unit))
}

/// `whole.frac * multiplier`, exactly; `None` on overflow or when the result is not whole.
fn scaled(whole: &str, frac: &str, multiplier: u64) -> Option<u64> {
    if frac.len() > 18 {
        return None;
    }
    let whole: u128 = whole.parse().ok()?;
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    let denominator = 10u128.pow(frac.len() as u32);
    let m = u128::from(multiplier);
    let frac_scaled = frac_value * m;
    if !frac_scaled.is_multiple_of(denominator) {
        return None;
    }
    let total = whole
        .checked_mul(m)?
        .checked_add(frac_scaled / denominator)?;
    u64::try_from(total).ok()
}

impl Quantity {
    /// A size of exactly `bytes`, written as a plain number.
    pub fn from_bytes(bytes: u64) -> Self {
        Quantity {
            bytes,
            text: bytes.to_string(),
        }
    }

    pub fn as_bytes(&self) -> u64 {
        self.bytes
    }

    /// The text the user wrote.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || QuantityError(s.to_string());
        let text = s.trim();
        let (whole, frac, unit) = split_number(text).ok_or_else(err)?;
        let multiplier = SIZE_UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|(_, m)| *m)
            .ok_or_else(err)?;
        let bytes = scaled(whole, frac, multiplier).ok_or_else(err)?;
        Ok(Quantity {
            bytes,
            text: text.to_string(),
        })
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for Quantity {}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.bytes.hash(state);
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.bytes.cmp(&other.bytes)
    }
}

/// A CPU amount in millicores: `2` is two CPUs, `500m` half of one, `1.5` one and a half.
#[derive(Debug, Clone)]
pub struct CpuQuantity {
    millis: u64,
    text: String,
}

/// The text did not parse as a CPU amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a CPU quantity")]
pub struct CpuQuantityError(pub String);

/// Pattern of the JSON Schema for CPU amounts.
pub const CPU_PATTERN: &str = r"^([0-9]+m|[0-9]+(\.[0-9]{1,3})?)$";

impl CpuQuantity {
    /// `cpus` whole CPUs.
    pub fn from_cpus(cpus: u32) -> Self {
        CpuQuantity {
            millis: u64::from(cpus) * 1000,
            text: cpus.to_string(),
        }
    }

    pub fn millis(&self) -> u64 {
        self.millis
    }

    /// Whether this is a whole number of CPUs.
    pub fn is_whole(&self) -> bool {
        self.millis.is_multiple_of(1000)
    }

    /// Whole CPUs, rounded up: the CPU count to pin when only whole CPUs can be given.
    pub fn cpus_ceil(&self) -> u64 {
        self.millis.div_ceil(1000)
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl FromStr for CpuQuantity {
    type Err = CpuQuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CpuQuantityError(s.to_string());
        let text = s.trim();
        let millis = if let Some(m) = text.strip_suffix('m') {
            if m.is_empty() || !m.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            m.parse::<u64>().map_err(|_| err())?
        } else {
            let (whole, frac, unit) = split_number(text).ok_or_else(err)?;
            if !unit.is_empty() || frac.len() > 3 {
                return Err(err());
            }
            scaled(whole, frac, 1000).ok_or_else(err)?
        };
        Ok(CpuQuantity {
            millis,
            text: text.to_string(),
        })
    }
}

impl fmt::Display for CpuQuantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for CpuQuantity {
    fn eq(&self, other: &Self) -> bool {
        self.millis == other.millis
    }
}

impl Eq for CpuQuantity {}

impl Hash for CpuQuantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.millis.hash(state);
    }
}

/// Serde support for types that are written as strings but that YAML users often write as bare
/// numbers (`cpu: 2`, `memory: 1000`, `PORT: 3000`).
pub(crate) mod scalar {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::marker::PhantomData;
    use std::str::FromStr;

    use serde::Deserializer;
    use serde::de::{self, DeserializeSeed, Visitor};

    /// Deserializes a string, integer or float through `FromStr`, with the parse error as the
    /// message (so the path-tracking deserializer puts the field in front of it).
    pub fn from_str_or_number<'de, D, T>(d: D, expecting: &'static str) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: FromStr,
        T::Err: fmt::Display,
    {
        struct V<T>(&'static str, PhantomData<T>);
        impl<T> Visitor<'_> for V<T>
        where
            T: FromStr,
            T::Err: fmt::Display,
        {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
                self.visit_str(&v.to_string())
            }
        }
        d.deserialize_any(V(expecting, PhantomData))
    }

    /// What a string-valued field makes of a number or boolean written bare.
    #[derive(Debug, Clone, Copy)]
    pub enum Bare {
        /// Refused with a hint to quote it.
        Refuse,
        /// Integers and booleans taken as their text. Floats are refused: YAML has already
        /// turned `1.10` into 1.1, so the text the user meant is lost, and a different string
        /// would be stored.
        AsText,
    }

    /// A string, or a number or boolean taken as its text ([`Bare::AsText`]).
    pub fn string_like<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        d.deserialize_any(Text(Bare::AsText))
    }

    /// A map of strings, a number or boolean written bare as a value treated as `bare` says.
    pub fn string_map<'de, D: Deserializer<'de>>(
        d: D,
        bare: Bare,
    ) -> Result<BTreeMap<String, String>, D::Error> {
        struct Values(Bare);
        impl<'de> Visitor<'de> for Values {
            type Value = BTreeMap<String, String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut values = BTreeMap::new();
                while let Some(key) = map.next_key()? {
                    values.insert(key, map.next_value_seed(Text(self.0))?);
                }
                Ok(values)
            }
        }
        d.deserialize_map(Values(bare))
    }

    /// Reads one string under a [`Bare`] policy: the visitor, and the seed for map values.
    struct Text(Bare);

    impl Text {
        fn bare<E: de::Error>(&self, v: impl fmt::Display, float: bool) -> Result<String, E> {
            match self.0 {
                Bare::Refuse => Err(E::custom(format!("must be a string (quote it: \"{v}\")"))),
                Bare::AsText if float => Err(E::custom(format!(
                    "the number {v} must be quoted to be kept as written (e.g. \"{v}\")"
                ))),
                Bare::AsText => Ok(v.to_string()),
            }
        }
    }

    impl<'de> DeserializeSeed<'de> for Text {
        type Value = String;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Text {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
            Ok(v)
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            self.bare(v, false)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            self.bare(v, false)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            self.bare(v, true)
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            self.bare(v, false)
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<String, A::Error> {
            match self.0 {
                Bare::Refuse => Err(de::Error::custom("must be a string, not a list")),
                Bare::AsText => Err(de::Error::invalid_type(de::Unexpected::Seq, &self)),
            }
        }
        fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<String, A::Error> {
            match self.0 {
                Bare::Refuse => Err(de::Error::custom("must be a string, not a mapping")),
                Bare::AsText => Err(de::Error::invalid_type(de::Unexpected::Map, &self)),
            }
        }
    }
}

macro_rules! string_serde {
    ($ty:ty, $name:literal, $expecting:literal, $pattern:expr, $description:literal) => {
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                crate::quantity::scalar::from_str_or_number(d, $expecting)
            }
        }

        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                $name.into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "type": "string",
                    "pattern": $pattern,
                    "description": $description,
                })
            }
        }
    };
}

pub(crate) use string_serde;

string_serde!(
    Quantity,
    "Quantity",
    "a size such as 4GiB",
    QUANTITY_PATTERN,
    "A size: a number with an optional unit (Ki, Mi, Gi, Ti with an optional B are powers of 1024; k, M, G, T powers of 1000), e.g. 4GiB, 512MiB, 20G."
);
string_serde!(
    CpuQuantity,
    "CpuQuantity",
    "a CPU amount such as 2 or 500m",
    CPU_PATTERN,
    "CPUs: a whole or decimal number of CPUs, or millicores with an m suffix, e.g. 2, 1.5, 500m."
);
