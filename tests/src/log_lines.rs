//! What every JSON log line of our services must be, for the pipelines that parse them: an object
//! with each key once (a second `message` is dropped or refused by most collectors) and no Rust
//! `Debug` rendering of an `Option` (`Some("team-a")`) in a value.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use std::{collections::HashSet, fmt};

/// The problems of the JSON lines of `log` (lines that start with `{`; a process's last words on
/// exit, such as `Error: …`, are text), each with its line number.
pub fn problems(log: &str) -> Vec<String> {
    log.lines()
        .enumerate()
        .filter(|(_, line)| line.starts_with('{'))
        .filter_map(|(i, line)| {
            let mut found = Vec::new();
            let mut deserializer = serde_json::Deserializer::from_str(line);
            if let Err(e) = deserializer.deserialize_any(Check(&mut found)) {
                found.push(format!("not JSON: {e}"));
            }
            (!found.is_empty()).then(|| format!("line {}: {}: {line}", i + 1, found.join("; ")))
        })
        .collect()
}

/// Walks one JSON value, noting duplicate keys and `Some(` in strings.
struct Check<'a>(&'a mut Vec<String>);

impl<'de> Visitor<'de> for Check<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<(), E> {
        if value.contains("Some(") {
            self.0.push(format!("a value holds Some(: {value:?}"));
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key.clone()) {
                self.0.push(format!("the key {key:?} twice"));
            }
            map.next_value_seed(Seed(self.0))?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Seed(self.0))?.is_some() {}
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

/// [`Check`] for a nested value.
struct Seed<'a>(&'a mut Vec<String>);

impl<'de> de::DeserializeSeed<'de> for Seed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(Check(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_key_or_an_option_in_a_value_is_a_problem() {
        let good = r#"{"level":"INFO","fields":{"message":"denied","namespace":"team-a","detail":"x"}}"#;
        assert!(problems(good).is_empty());
        let twice = r#"{"fields":{"message":"denied","message":"the reason"}}"#;
        assert!(
            problems(twice)[0].contains("the key \"message\" twice"),
            "{:?}",
            problems(twice)
        );
        let option = r#"{"fields":{"namespace":"Some(\"team-a\")"}}"#;
        assert!(problems(option)[0].contains("Some("));
        let nested = r#"{"spans":[{"a":1,"a":2}]}"#;
        assert_eq!(problems(nested).len(), 1);
        assert!(problems("Error: lost the leader lease\n").is_empty());
        assert!(problems("{not json").len() == 1);
    }
}
