//! The globs of `spec.keys` and `spec.metadata`: `*` matches any run of characters (`/` included),
//! `?` exactly one; everything else is literal.

use wildmatch::WildMatch;

/// Whether any of `globs` matches `key`.
pub fn matches_any(globs: &[String], key: &str) -> bool {
    globs.iter().any(|g| WildMatch::new(g).matches(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_and_question_mark_are_the_only_wildcards() {
        let globs = |g: &[&str]| g.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        // (globs, key, matches)
        for (g, key, want) in [
            (globs(&["ca.crt"]), "ca.crt", true),
            (globs(&["ca.crt"]), "tls.crt", false),
            (globs(&["*.crt"]), "tls.crt", true),
            (globs(&["*.crt"]), "tls.key", false),
            (globs(&["tls.???"]), "tls.key", true),
            (globs(&["tls.???"]), "tls.keys", false),
            (
                globs(&["kustomize.toolkit.fluxcd.io/*"]),
                "kustomize.toolkit.fluxcd.io/name",
                true,
            ),
            (globs(&["*"]), "a/b", true),
            (globs(&[]), "anything", false),
            (globs(&["a", "b*"]), "bee", true),
        ] {
            assert_eq!(matches_any(&g, key), want, "{g:?} {key}");
        }
    }
}
