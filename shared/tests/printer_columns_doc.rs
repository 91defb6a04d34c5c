//! Every `kubectl get` of our CRs in the docs shows the columns the installed CRDs print
//! (`additionalPrinterColumns` in charts/projection/crd-manifests/): a column added, renamed or moved
//! without its samples fails here, `-o wide` samples included (they add the priority-1 columns).

use serde_yaml::Value;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The column headers `kubectl get` prints for the CRD in `file`: NAME, then each printer column
/// (upper-cased, as kubectl prints them) whose priority is 0, or any priority with `wide`.
fn headers(file: &str, wide: bool) -> Vec<String> {
    let path = root().join("charts/projection/crd-manifests").join(file);
    let crd: Value =
        serde_yaml::from_str(&std::fs::read_to_string(&path).expect("the CRD")).expect("CRD YAML");
    let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_sequence()
        .expect("printer columns");
    std::iter::once("NAME".to_owned())
        .chain(columns.iter().filter_map(|c| {
            let priority = c["priority"].as_i64().unwrap_or(0);
            (wide || priority == 0).then(|| c["name"].as_str().expect("a name").to_uppercase())
        }))
        .collect()
}

/// The CRD file of the resource a `kubectl get` names (`proj`, `projections`, `cproj/x`, ...).
fn crd_file(resource: &str) -> Option<&'static str> {
    let resource = resource.split('/').next().unwrap_or_default();
    let resource = resource.strip_suffix(".projection.sh").unwrap_or(resource);
    match resource {
        "projection" | "projections" | "proj" => Some("projections.projection.sh.yaml"),
        "clusterprojection" | "clusterprojections" | "cproj" => Some("clusterprojections.projection.sh.yaml"),
        _ => None,
    }
}

/// Every Markdown file users read: docs/, the README and the chart's README.
fn documents() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    files.push(root().join("README.md"));
    files.push(root().join("charts/projection/README.md"));
    files.sort();
    files
}

#[test]
fn kubectl_get_samples_show_the_crds_printer_columns() {
    let mut checked = 0;
    let mut wrong = Vec::new();
    for path in documents() {
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(command) = line.trim_start().strip_prefix("$ kubectl get ") else {
                continue;
            };
            let args: Vec<&str> = command.split_whitespace().collect();
            let Some(file) = args.first().and_then(|r| crd_file(r)) else {
                continue;
            };
            let output = args
                .windows(2)
                .find(|w| w[0] == "-o" || w[0] == "--output")
                .map(|w| w[1])
                .or_else(|| {
                    args.iter()
                        .find_map(|a| a.strip_prefix("--output=").or(a.strip_prefix("-o")))
                });
            let wide = match output {
                None | Some("") => false,
                Some("wide") => true,
                Some(_) => continue, // yaml, json, jsonpath, custom-columns: no table
            };
            // The table follows the command; anything else (an error, "No resources found") is not one.
            let Some(header) = lines
                .get(i + 1)
                .map(|l| l.trim())
                .filter(|l| l.starts_with("NAME") || l.starts_with("NAMESPACE"))
            else {
                continue;
            };
            let mut expected = headers(file, wide);
            if args.iter().any(|a| *a == "-A" || *a == "--all-namespaces") {
                expected.insert(0, "NAMESPACE".to_owned());
            }
            let shown: Vec<String> = header.split_whitespace().map(str::to_owned).collect();
            checked += 1;
            if shown != expected {
                wrong.push(format!(
                    "{}:{}: `kubectl get {command}` shows\n  {}\nthe CRD prints\n  {}",
                    path.strip_prefix(root()).unwrap_or(&path).display(),
                    i + 2,
                    shown.join(" "),
                    expected.join(" ")
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The samples are found at all (a change of the prompt or of this reading would check nothing).
    assert!(
        checked >= 10,
        "only {checked} kubectl get samples of our CRs found"
    );
}
