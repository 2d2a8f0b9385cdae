//! `train_data_path` and `valid_data_path`: one path, a list of shards, or Megatron's blend
//! `[weight, prefix, weight, prefix, ...]`. A path is an llm.c token file, a Megatron
//! dataset prefix (`PREFIX.idx` + `PREFIX.bin`) or a glob of either (data::source resolves
//! them). Written back as it was read, so a run dir's config.yaml loads again.

use serde::de::Error;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_norway::Value;

#[derive(Clone, Debug, PartialEq)]
pub enum DataPath {
    /// One file, prefix or glob.
    One(String),
    /// Shards: every window of every file, one pool, files in the order listed.
    Shards(Vec<String>),
    /// Sources drawn by weight (as written; they need not sum to 1).
    Blend(Vec<(f64, String)>),
}

impl DataPath {
    /// The sources and their weights, normalised as Megatron does (each over their sum).
    pub fn sources(&self) -> Vec<(f64, Vec<String>)> {
        match self {
            DataPath::One(p) => vec![(1.0, vec![p.clone()])],
            DataPath::Shards(list) => vec![(1.0, list.clone())],
            DataPath::Blend(pairs) => {
                let sum: f64 = pairs.iter().map(|p| p.0).sum();
                pairs.iter().map(|(w, p)| (w / sum, vec![p.clone()])).collect()
            }
        }
    }

    /// How a source is named in metrics and the report: its path as written, a shard list
    /// as a YAML list.
    pub fn source_names(&self) -> Vec<String> {
        match self {
            DataPath::One(p) => vec![p.clone()],
            DataPath::Shards(list) => vec![format!("[{}]", list.join(", "))],
            DataPath::Blend(pairs) => pairs.iter().map(|p| p.1.clone()).collect(),
        }
    }

    fn from_value(v: Value) -> Result<DataPath, String> {
        let path = |v: Value| match v {
            Value::String(s) if !s.is_empty() => Ok(s),
            other => Err(format!("{} is not a path", super::show(&other))),
        };
        let Value::Sequence(items) = v else { return path(v).map(DataPath::One) };
        if items.is_empty() {
            return Err("an empty list names no data".into());
        }
        if !items[0].is_number() {
            return items.into_iter().map(path).collect::<Result<_, _>>().map(DataPath::Shards);
        }
        if items.len() % 2 == 1 {
            return Err(format!(
                "a blend is [weight, prefix, weight, prefix, ...]; {} entries do not pair up",
                items.len()
            ));
        }
        let mut pairs: Vec<(f64, String)> = Vec::new();
        for pair in items.chunks(2) {
            let w = pair[0]
                .as_f64()
                .filter(|w| w.is_finite() && *w > 0.0)
                .ok_or_else(|| format!("blend weight {} must be a number > 0", super::show(&pair[0])))?;
            let p = path(pair[1].clone())?;
            if pairs.iter().any(|(_, q)| *q == p) {
                return Err(format!("the blend lists `{p}` twice"));
            }
            pairs.push((w, p));
        }
        Ok(DataPath::Blend(pairs))
    }
}

impl Serialize for DataPath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            DataPath::One(p) => s.serialize_str(p),
            DataPath::Shards(list) => list.serialize(s),
            DataPath::Blend(pairs) => {
                let flat: Vec<Value> =
                    pairs.iter().flat_map(|(w, p)| [Value::from(*w), Value::from(p.as_str())]).collect();
                flat.serialize(s)
            }
        }
    }
}

impl<'de> Deserialize<'de> for DataPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        DataPath::from_value(Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<DataPath, String> {
        serde_norway::from_str::<DataPath>(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn the_three_forms_parse_and_write_back_as_read() {
        let cases = [
            ("data/corpus/train.bin", DataPath::One("data/corpus/train.bin".into())),
            ("[a_000.bin, a_001.bin]", DataPath::Shards(vec!["a_000.bin".into(), "a_001.bin".into()])),
            (
                "[0.7, web, 0.3, 'code/*.bin']",
                DataPath::Blend(vec![(0.7, "web".into()), (0.3, "code/*.bin".into())]),
            ),
            ("[3, x, 1, y]", DataPath::Blend(vec![(3.0, "x".into()), (1.0, "y".into())])),
        ];
        for (yaml, want) in cases {
            let got = parse(yaml).unwrap();
            assert_eq!(got, want, "{yaml}");
            let again = serde_norway::to_string(&got).unwrap();
            assert_eq!(parse(&again).unwrap(), want, "{again}");
        }
    }

    #[test]
    fn blend_weights_are_normalised_over_their_sum() {
        let b = parse("[3, x, 1, y]").unwrap();
        assert_eq!(b.sources(), [(0.75, vec!["x".to_string()]), (0.25, vec!["y".to_string()])]);
        assert_eq!(b.source_names(), ["x", "y"]);
        let s = parse("[a, b]").unwrap();
        assert_eq!(s.sources(), [(1.0, vec!["a".to_string(), "b".to_string()])]);
        assert_eq!(s.source_names(), ["[a, b]"]);
    }

    #[test]
    fn malformed_forms_say_what_is_wrong() {
        let cases = [
            ("[]", "an empty list names no data"),
            ("[0.5, a, 0.5]", "a blend is [weight, prefix, weight, prefix, ...]; 3 entries do not pair up"),
            ("[0, a, 1, b]", "blend weight 0 must be a number > 0"),
            ("[-1, a, 1, b]", "blend weight -1 must be a number > 0"),
            ("[1, a, b, c]", "blend weight b must be a number > 0"),
            ("[1, a, 1, 2]", "2 is not a path"),
            ("[1, a, 2, a]", "the blend lists `a` twice"),
            ("[a, {b: 1}]", "b: 1 is not a path"),
            ("''", "'' is not a path"),
        ];
        for (yaml, want) in cases {
            let got = parse(yaml).unwrap_err();
            assert!(got.starts_with(want), "{yaml}: {got}");
        }
    }
}
