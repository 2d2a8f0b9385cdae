//! Config values that are one of a few names: the enums the config parses them into, and
//! their serde, written by name and read by name with an error that lists the accepted ones.
//!
//! A type takes part by implementing [`Named`]; fields use `#[serde(with = "named")]`
//! (or `named::option`, `named::list`).

use schedules::ScheduleKind;
use serde::{de::Error, Deserialize, Deserializer, Serializer};
use stages::{Norm, NormPlacement, OffloadModule, QkNormSpan};

/// A value written as one of a fixed set of names.
pub trait Named: Sized + Copy + PartialEq + 'static {
    const ALL: &'static [Self];
    fn name(self) -> &'static str;

    /// The value of `name`, or "`name` is not one of a, b, c".
    fn parse(name: &str) -> Result<Self, String> {
        Self::ALL.iter().copied().find(|v| v.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Self::ALL.iter().map(|v| v.name()).collect();
            format!("`{name}` is not one of {}", names.join(", "))
        })
    }
}

/// An enum of config values and its [`Named`] implementation, from (variant, name) pairs.
macro_rules! named_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl Named for $name {
            const ALL: &'static [Self] = &[$(Self::$variant,)+];
            fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum! {
    /// `device`: where the ranks compute.
    DeviceKind {
        Cpu = "cpu",
        Cuda = "cuda",
    }
}

named_enum! {
    /// `precision`: what a CUDA device stores activations in (the CPU computes in fp32).
    Precision {
        Fp32 = "fp32",
        Bf16 = "bf16",
    }
}

named_enum! {
    /// `recompute_granularity`, Megatron's: none, every layer of a group, or the selected
    /// modules of every layer.
    RecomputeGranularity {
        None = "none",
        Full = "full",
        Selective = "selective",
    }
}

named_enum! {
    /// `recompute_method` of full recompute: groups of N layers, or the first N layers.
    RecomputeMethod {
        Uniform = "uniform",
        Block = "block",
    }
}

named_enum! {
    /// One of `recompute_modules`, what selective recompute drops.
    RecomputeModule {
        CoreAttn = "core_attn",
        Mlp = "mlp",
        Layernorm = "layernorm",
    }
}

named_enum! {
    /// `lr_decay_style` after warmup.
    LrDecayStyle {
        Cosine = "cosine",
        Linear = "linear",
        Constant = "constant",
    }
}

named_enum! {
    /// `position_embedding_type`, Megatron's.
    PositionEmbeddingType {
        LearnedAbsolute = "learned_absolute",
        Rope = "rope",
    }
}

/// [`Named`] for enums other crates define with their own `ALL` and `name`: the config reads
/// and writes them by those names.
macro_rules! named_by_own_names {
    ($($name:ident),+) => {
        $(impl Named for $name {
            const ALL: &'static [Self] = &$name::ALL;
            fn name(self) -> &'static str {
                $name::name(self)
            }
        })+
    };
}

named_by_own_names!(ScheduleKind, OffloadModule, Norm, NormPlacement, QkNormSpan);

pub fn serialize<T: Named, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(value.name())
}

pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<T, D::Error> {
    T::parse(&String::deserialize(d)?).map_err(D::Error::custom)
}

/// An optional value: null when unset.
pub mod option {
    use super::*;

    pub fn serialize<T: Named, S: Serializer>(value: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_some(v.name()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<Option<T>, D::Error> {
        Option::<String>::deserialize(d)?.map(|name| T::parse(&name).map_err(D::Error::custom)).transpose()
    }
}

/// An optional list of values.
pub mod list {
    use super::*;

    pub fn serialize<T: Named, S: Serializer>(value: &Option<Vec<T>>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(list) => s.collect_seq(list.iter().map(|v| v.name())),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T: Named, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<T>>, D::Error> {
        let names = Option::<Vec<String>>::deserialize(d)?;
        names.map(|list| list.iter().map(|n| T::parse(n).map_err(D::Error::custom)).collect()).transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_errors_list_the_accepted() {
        for style in LrDecayStyle::ALL {
            assert_eq!(LrDecayStyle::parse(style.name()), Ok(*style));
        }
        assert_eq!(LrDecayStyle::parse("step"), Err("`step` is not one of cosine, linear, constant".into()));
        assert_eq!(
            ScheduleKind::parse("1F1B"),
            Err("`1F1B` is not one of gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, dualpipe-v".into())
        );
    }
}
