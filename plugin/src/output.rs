//! Printing: kubectl-style columns, JSON and YAML.

use crate::{cli::Output, exit::Failure};
use anyhow::Context as _;
use serde::Serialize;

/// Columns aligned as kubectl prints them (three spaces between columns, `<none>` for empty cells
/// is left to the caller).
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut out = String::new();
        for (i, cell) in cells.into_iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(headers.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// `value` as JSON or YAML when `-o` asks for either; `None` for the columns.
pub fn structured<T: Serialize>(output: Output, value: &T) -> Result<Option<String>, Failure> {
    Ok(match output {
        Output::Json => Some(serde_json::to_string_pretty(value).context("encoding JSON")? + "\n"),
        Output::Yaml => Some(serde_yaml::to_string(value).context("encoding YAML")?),
        Output::Table | Output::Wide => None,
    })
}

/// An empty cell as kubectl shows it.
pub fn or_none(text: &str) -> String {
    if text.is_empty() {
        "<none>".to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_lines_carry_no_trailing_space() {
        let rows = vec![
            vec!["a".to_owned(), "longer".to_owned(), String::new()],
            vec!["bbbb".to_owned(), "x".to_owned(), "z".to_owned()],
        ];
        assert_eq!(
            table(&["NAME", "STATE", "NOTE"], &rows),
            "NAME   STATE    NOTE\na      longer\nbbbb   x        z\n"
        );
    }
}
