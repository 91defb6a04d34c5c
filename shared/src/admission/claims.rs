//! What each CR claims, for admission to know the other CRs (SPEC §10): the objects its copies
//! occupy and the object it reads. [`ClaimIndex`] answers the two questions of a new spec: which
//! other CRs already claim one of its copies (an overlap: an admission warning naming them), and
//! whether its copies flow, through other CRs, back into its own source (a loop: denied, with the
//! chain). Pure: the webhook feeds the index from its watches and resolves selectors against the
//! namespaces as they are now.

use crate::{
    api::crd::{ClusterProjectionSpec, KubeConfigReference, ProjectionSpec, SourceRef},
    pass::targets::TargetRule,
};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    fmt,
};

/// An object, by group, kind, namespace and name (versions do not matter: one object), in this
/// cluster or in the one a kubeconfig Secret names.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Coordinates {
    /// The other cluster it is in, by the kubeconfig Secret that reaches it, or by its identity
    /// once known ([`KnownClusters`]; `None`: this one). Two CRs are known to write the same object
    /// there when they name the same Secret, or Secrets known to reach the same cluster.
    pub cluster: Option<String>,
    /// API group; empty for the core group.
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl Coordinates {
    fn of_source(source: &SourceRef) -> Self {
        Self {
            cluster: None,
            group: source.group.clone(),
            kind: source.kind.clone(),
            namespace: source.namespace.clone(),
            name: source.name.clone(),
        }
    }

    fn copy_of(source: &SourceRef, (cluster, namespace): (Option<&str>, &str), name: &str) -> Self {
        Self {
            cluster: cluster.map(str::to_owned),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            ..Self::of_source(source)
        }
    }
}

impl fmt::Display for Coordinates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        write!(f, "{}{group} {}/{}", self.kind, self.namespace, self.name)?;
        match &self.cluster {
            Some(cluster) => write!(f, " in the cluster of {cluster}"),
            None => Ok(()),
        }
    }
}

/// A CR that claims objects (also how `kubectl projection` names a CR).
pub use crate::api::kind::CrName as Claimant;

/// One CR's footprint: the object it reads and the objects its copies occupy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// The source.
    pub source: Coordinates,
    /// The copies.
    pub copies: Vec<Coordinates>,
}

/// Which clusters admission knows kubeconfig Secrets to reach: this cluster's identity (as
/// `projection.sh/source-cluster` names clusters) and, per Secret, the identity of the cluster a CR
/// that uses it recorded (`status.writtenDestination.clusterIdentity`: the controller reads it there
/// when the kubeconfig's credentials may). Copies are placed by identity where it is known, so a
/// Secret that reaches this very cluster writes here (its loops are loops), and two Secrets that
/// reach one cluster write into the same one; elsewhere by their Secret, as before.
#[derive(Clone, Debug, Default)]
pub struct KnownClusters {
    this: Option<String>,
    reached: HashMap<String, String>,
}

impl KnownClusters {
    /// Nothing known yet but this cluster's identity, if read.
    pub fn new(this: Option<String>) -> Self {
        Self {
            this: this.filter(|i| !i.is_empty()),
            reached: HashMap::new(),
        }
    }

    /// Learns from a CR's status that the Secret of `claim`'s copies reached the cluster
    /// `recorded` (the identity it recorded, if any).
    pub fn learn(&mut self, claim: &Claim, recorded: Option<&str>) {
        let Some(identity) = recorded.filter(|i| !i.is_empty()) else {
            return;
        };
        for secret in claim.copies.iter().filter_map(|c| c.cluster.as_deref()) {
            self.reached.insert(secret.to_owned(), identity.to_owned());
        }
    }

    /// Where a copy `cluster` (a Secret's label, `None`: here) names lands, given the identity its
    /// CR recorded for that cluster or, without one, what a CR recorded for the same Secret.
    fn place(&self, cluster: Option<&str>, recorded: Option<&str>) -> Option<String> {
        let secret = cluster?;
        let identity = recorded
            .filter(|i| !i.is_empty())
            .or_else(|| self.reached.get(secret).map(String::as_str));
        match identity {
            Some(identity) if self.this.as_deref() == Some(identity) => None,
            Some(identity) => Some(format!("identity {identity}")),
            None => Some(secret.to_owned()),
        }
    }
}

impl Claim {
    /// The same claim, its copies placed by the identity of the cluster they land in where known
    /// ([`KnownClusters`]); `recorded` is the identity the CR's own status recorded, if any.
    #[must_use]
    pub fn placed(mut self, clusters: &KnownClusters, recorded: Option<&str>) -> Self {
        for copy in &mut self.copies {
            copy.cluster = clusters.place(copy.cluster.as_deref(), recorded);
        }
        self
    }
}

/// The cluster a kubeconfig Secret reaches, as claims name it: the Secret's namespace (`None`: the
/// controller's, a ClusterProjection's), name and key.
fn cluster_of(namespace: Option<&str>, kube_config: Option<&KubeConfigReference>) -> Option<String> {
    let secret = &kube_config?.secret_ref;
    let namespace = namespace.unwrap_or("the controller's namespace");
    Some(format!("Secret {namespace}/{} key {}", secret.name, secret.key()))
}

/// The claim of a Projection in `namespace`.
pub fn projection_claim(namespace: &str, spec: &ProjectionSpec) -> Claim {
    let destination = spec.destination.as_ref();
    let name = destination
        .and_then(|d| d.name.as_deref())
        .unwrap_or(&spec.source.name);
    let cluster = cluster_of(Some(namespace), destination.and_then(|d| d.kube_config.as_ref()));
    Claim {
        source: Coordinates::of_source(&spec.source),
        copies: vec![Coordinates::copy_of(
            &spec.source,
            (cluster.as_deref(), namespace),
            name,
        )],
    }
}

/// The claim of a ClusterProjection whose targets are `namespaces` (its list, or the namespaces its
/// selector matches now). The source's own coordinates are never a copy (the controller skips them).
pub fn cluster_claim(spec: &ClusterProjectionSpec, namespaces: &[String]) -> Claim {
    let name = spec.destination.name.as_deref().unwrap_or(&spec.source.name);
    let source = Coordinates::of_source(&spec.source);
    let cluster = cluster_of(None, spec.destination.kube_config.as_ref());
    let copies = namespaces
        .iter()
        .map(|ns| Coordinates::copy_of(&spec.source, (cluster.as_deref(), ns), name))
        .filter(|copy| *copy != source)
        .collect();
    Claim { source, copies }
}

/// The namespaces a ClusterProjection claims now: every listed one (existing or not), or those of
/// `namespaces` (name → labels) its selector matches. An unusable destination claims none, nor a
/// selector evaluated in another cluster, whose namespaces admission does not see.
pub fn cluster_targets(
    spec: &ClusterProjectionSpec,
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<String> {
    match TargetRule::of(&spec.destination) {
        Ok(TargetRule::List(list)) => list,
        Ok(_) if spec.destination.kube_config.is_some() => Vec::new(),
        Ok(rule) => namespaces
            .iter()
            .filter(|(name, labels)| rule.selects(name, labels))
            .map(|(name, _)| name.clone())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// What admission says about a spec's claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimVerdict {
    /// One warning per copy already claimed by another CR.
    pub warnings: Vec<String>,
    /// The denial when the spec closes a loop.
    pub denial: Option<String>,
}

/// Checks the claim of `who` against the other CRs in `index`.
pub fn check(index: &ClaimIndex, who: &Claimant, claim: &Claim) -> ClaimVerdict {
    ClaimVerdict {
        warnings: index
            .overlaps(who, claim)
            .iter()
            .map(|(copy, other)| overlap_warning(copy, other))
            .collect(),
        denial: index.loop_through(who, claim).map(|chain| loop_message(&chain)),
    }
}

/// One hop of a loop: `claimant` copies `from` to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hop {
    /// The CR.
    pub claimant: Claimant,
    /// What it reads.
    pub from: Coordinates,
    /// One of its copies.
    pub to: Coordinates,
}

/// Every CR's claim, indexed by copy and by source.
#[derive(Debug, Default)]
pub struct ClaimIndex {
    claims: HashMap<Claimant, Claim>,
    holders: HashMap<Coordinates, BTreeSet<Claimant>>,
    readers: HashMap<Coordinates, BTreeSet<Claimant>>,
}

impl ClaimIndex {
    /// Records (or replaces) the claim of `who`.
    pub fn set(&mut self, who: Claimant, claim: Claim) {
        self.remove(&who);
        for copy in &claim.copies {
            self.holders.entry(copy.clone()).or_default().insert(who.clone());
        }
        self.readers
            .entry(claim.source.clone())
            .or_default()
            .insert(who.clone());
        self.claims.insert(who, claim);
    }

    /// Forgets `who`.
    pub fn remove(&mut self, who: &Claimant) {
        let Some(old) = self.claims.remove(who) else {
            return;
        };
        for copy in &old.copies {
            forget(&mut self.holders, copy, who);
        }
        forget(&mut self.readers, &old.source, who);
    }

    /// Every CR the index holds.
    pub fn claimants(&self) -> impl Iterator<Item = &Claimant> {
        self.claims.keys()
    }

    /// How many CRs the index holds.
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// Whether the index holds no CR.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// The other CRs that already claim one of `claim`'s copies, by copy, sorted.
    pub fn overlaps(&self, who: &Claimant, claim: &Claim) -> Vec<(Coordinates, Claimant)> {
        let mut found: Vec<(Coordinates, Claimant)> = claim
            .copies
            .iter()
            .flat_map(|copy| {
                self.holders
                    .get(copy)
                    .into_iter()
                    .flatten()
                    .filter(|other| *other != who)
                    .map(|other| (copy.clone(), other.clone()))
            })
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// The chain through which `claim`'s copies would flow back into its own source, through the
    /// other CRs (breadth first, so the shortest), or `None`.
    pub fn loop_through(&self, who: &Claimant, claim: &Claim) -> Option<Vec<Hop>> {
        // How each object was reached: the hop that wrote it.
        let mut reached: HashMap<&Coordinates, Hop> = HashMap::new();
        let mut queue: VecDeque<&Coordinates> = VecDeque::new();
        for copy in &claim.copies {
            let hop = Hop {
                claimant: who.clone(),
                from: claim.source.clone(),
                to: copy.clone(),
            };
            if reached.insert(copy, hop).is_none() {
                queue.push_back(copy);
            }
        }
        while let Some(object) = queue.pop_front() {
            if *object == claim.source {
                let mut chain = vec![reached[object].clone()];
                while chain.last().is_some_and(|h| h.from != claim.source) {
                    let from = &chain.last()?.from;
                    chain.push(reached.get(from)?.clone());
                }
                chain.reverse();
                return Some(chain);
            }
            for reader in self
                .readers
                .get(object)
                .into_iter()
                .flatten()
                .filter(|r| *r != who)
            {
                let Some(theirs) = self.claims.get(reader) else {
                    continue;
                };
                for copy in &theirs.copies {
                    if !reached.contains_key(copy) {
                        let hop = Hop {
                            claimant: reader.clone(),
                            from: object.clone(),
                            to: copy.clone(),
                        };
                        reached.insert(copy, hop);
                        queue.push_back(copy);
                    }
                }
            }
        }
        None
    }
}

fn forget(map: &mut HashMap<Coordinates, BTreeSet<Claimant>>, key: &Coordinates, who: &Claimant) {
    if let Some(set) = map.get_mut(key) {
        set.remove(who);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// The admission warning of an overlap.
pub fn overlap_warning(copy: &Coordinates, other: &Claimant) -> String {
    format!("destination {copy} is already claimed by {other}; only one of them can write it")
}

/// The denial of a loop.
pub fn loop_message(chain: &[Hop]) -> String {
    let hops: Vec<String> = chain
        .iter()
        .map(|h| format!("{} copies {} to {}", h.claimant, h.from, h.to))
        .collect();
    format!(
        "this spec closes a loop of copies, each one the source of the next: {}",
        hops.join(", then ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn projection(namespace: &str, name: &str) -> Claimant {
        Claimant::Projection {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn cm(namespace: &str, name: &str) -> Coordinates {
        Coordinates {
            cluster: None,
            group: String::new(),
            kind: "ConfigMap".into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn projection_spec(source_ns: &str, source: &str, copy: Option<&str>) -> ProjectionSpec {
        serde_json::from_value(
            json!({"source": {"kind": "ConfigMap", "namespace": source_ns, "name": source},
            "destination": copy.map(|c| json!({"name": c}))}),
        )
        .unwrap()
    }

    #[test]
    fn a_selector_claims_the_namespaces_it_matches_now_and_a_list_every_listed_one() {
        let namespaces: BTreeMap<String, BTreeMap<String, String>> =
            [("a", "prod"), ("b", "dev"), ("c", "prod")]
                .into_iter()
                .map(|(n, env)| (n.to_owned(), BTreeMap::from([("env".to_owned(), env.to_owned())])))
                .collect();
        let selector: ClusterProjectionSpec = serde_json::from_value(json!({
            "source": {"kind": "ConfigMap", "namespace": "s", "name": "cfg"},
            "destination": {"namespaceSelector": {"matchLabels": {"env": "prod"}}}}))
        .unwrap();
        assert_eq!(cluster_targets(&selector, &namespaces), ["a", "c"]);
        // Matching the source's own namespace is no copy, hence no loop.
        let matching_source = cluster_claim(&selector, &["s".into(), "a".into()]);
        assert_eq!(matching_source.copies, [cm("a", "cfg")]);
        assert_eq!(
            ClaimIndex::default().loop_through(
                &Claimant::ClusterProjection { name: "c".into() },
                &matching_source
            ),
            None
        );
        let list: ClusterProjectionSpec = serde_json::from_value(json!({
            "source": {"kind": "ConfigMap", "namespace": "s", "name": "cfg"},
            "destination": {"namespaces": ["later", "b"]}}))
        .unwrap();
        assert_eq!(cluster_targets(&list, &namespaces), ["b", "later"]);
    }

    #[test]
    fn the_verdict_warns_of_overlaps_and_denies_loops() {
        let mut index = ClaimIndex::default();
        index.set(
            projection("b", "p"),
            projection_claim("b", &projection_spec("a", "cfg", None)),
        );
        let same_copy = projection_claim("b", &projection_spec("z", "other", Some("cfg")));
        let verdict = check(&index, &projection("b", "q"), &same_copy);
        assert_eq!(verdict.warnings.len(), 1);
        assert_eq!(verdict.denial, None);
        let back = projection_claim("a", &projection_spec("b", "cfg", None));
        let verdict = check(&index, &projection("a", "r"), &back);
        assert!(verdict.warnings.is_empty());
        assert!(
            verdict
                .denial
                .is_some_and(|d| d.contains("Projection b/p copies ConfigMap a/cfg"))
        );
    }

    #[test]
    fn copies_in_another_cluster_overlap_only_there_and_close_no_loop_here() {
        let remote = |secret: &str, source: (&str, &str)| -> ProjectionSpec {
            serde_json::from_value(json!({
                "source": {"kind": "ConfigMap", "namespace": source.0, "name": source.1},
                "destination": {"name": "cfg", "kubeConfig": {"secretRef": {"name": secret}}}}))
            .unwrap()
        };
        let mut index = ClaimIndex::default();
        index.set(
            projection("b", "local"),
            projection_claim("b", &projection_spec("a", "cfg", None)),
        );
        // The same name in the same namespace, but over there: no overlap with the local copy.
        let there = projection_claim("b", &remote("other", ("z", "x")));
        assert_eq!(
            there.copies[0].cluster.as_deref(),
            Some("Secret b/other key value")
        );
        assert!(
            check(&index, &projection("b", "remote"), &there)
                .warnings
                .is_empty()
        );
        index.set(projection("b", "remote"), there);
        // Another CR writing the same object through the same Secret does overlap.
        let again = projection_claim("b", &remote("other", ("y", "w")));
        let verdict = check(&index, &projection("b", "again"), &again);
        assert_eq!(verdict.warnings.len(), 1, "{verdict:?}");
        assert!(verdict.warnings[0].contains("in the cluster of Secret b/other key value"));
        // z/back copies b/cfg (here) to z/x, which b/remote copies to b/cfg over there: not the
        // b/cfg here, so no loop.
        let back = projection_claim("z", &projection_spec("b", "cfg", Some("x")));
        let verdict = check(&index, &projection("z", "back"), &back);
        assert_eq!(verdict.denial, None);
    }

    #[test]
    fn copies_are_placed_by_the_identity_of_their_cluster_once_a_cr_recorded_it() {
        let remote = |secret: &str, source: (&str, &str), copy: &str| -> ProjectionSpec {
            serde_json::from_value(json!({
                "source": {"kind": "ConfigMap", "namespace": source.0, "name": source.1},
                "destination": {"name": copy, "kubeConfig": {"secretRef": {"name": secret}}}}))
            .unwrap()
        };
        let mut clusters = KnownClusters::new(Some("uid-here".into()));
        let mut index = ClaimIndex::default();
        // b/out copies a/cfg through Secret b/self, which its status says reaches this cluster.
        let out = projection_claim("b", &remote("self", ("a", "cfg"), "cfg"));
        clusters.learn(&out, Some("uid-here"));
        let out = out.placed(&clusters, Some("uid-here"));
        assert_eq!(out.copies, [cm("b", "cfg")]);
        index.set(projection("b", "out"), out);
        // a/back copies b/cfg back onto a/cfg, here: the loop runs through that Secret.
        let back = projection_claim("a", &projection_spec("b", "cfg", Some("cfg"))).placed(&clusters, None);
        let verdict = check(&index, &projection("a", "back"), &back);
        assert!(
            verdict.denial.as_deref().is_some_and(|d| d.contains(
                "Projection a/back copies ConfigMap b/cfg to ConfigMap a/cfg, then Projection b/out \
                 copies ConfigMap a/cfg to ConfigMap b/cfg"
            )),
            "{verdict:?}"
        );
        // A new CR through the same Secret, not reconciled yet, lands where the first recorded.
        let again = projection_claim("b", &remote("self", ("z", "other"), "cfg")).placed(&clusters, None);
        assert_eq!(again.copies, [cm("b", "cfg")]);
        assert_eq!(check(&index, &projection("b", "again"), &again).warnings.len(), 1);
        // Two Secrets known to reach one other cluster write into the same one.
        let first =
            projection_claim("b", &remote("east-1", ("a", "x"), "x")).placed(&clusters, Some("uid-east"));
        assert_eq!(
            first.copies[0].to_string(),
            "ConfigMap b/x in the cluster of identity uid-east"
        );
        index.set(projection("b", "first"), first);
        let second =
            projection_claim("b", &remote("east-2", ("a", "y"), "x")).placed(&clusters, Some("uid-east"));
        assert_eq!(
            check(&index, &projection("b", "second"), &second).warnings,
            [
                "destination ConfigMap b/x in the cluster of identity uid-east is already claimed by \
              Projection b/first; only one of them can write it"
            ]
        );
        // Unknown (the credentials may not read it, or no pass yet): by the Secret, as before.
        let unknown = projection_claim("b", &remote("west", ("a", "x"), "x")).placed(&clusters, None);
        assert_eq!(
            unknown.copies[0].cluster.as_deref(),
            Some("Secret b/west key value")
        );
        // Without this cluster's identity, nothing is taken for here.
        let blind = projection_claim("b", &remote("self", ("a", "cfg"), "cfg"))
            .placed(&KnownClusters::new(None), Some("uid-here"));
        assert_eq!(blind.copies[0].cluster.as_deref(), Some("identity uid-here"));
    }

    #[test]
    fn claims_name_the_copies_of_both_kinds() {
        let claim = projection_claim("b", &projection_spec("a", "cfg", None));
        assert_eq!(claim.source, cm("a", "cfg"));
        assert_eq!(claim.copies, [cm("b", "cfg")]);
        let spec: ClusterProjectionSpec = serde_json::from_value(json!({
            "source": {"group": "example.com", "kind": "Widget", "namespace": "a", "name": "w"},
            "destination": {"namespaces": ["x"], "name": "copy"}}))
        .unwrap();
        let claim = cluster_claim(&spec, &["x".into(), "y".into()]);
        assert_eq!(claim.copies.len(), 2);
        assert_eq!(claim.copies[1].to_string(), "Widget.example.com y/copy");
    }

    #[test]
    fn an_overlap_names_the_other_claimants_and_never_the_cr_itself() {
        let mut index = ClaimIndex::default();
        index.set(
            projection("b", "first"),
            projection_claim("b", &projection_spec("a", "cfg", None)),
        );
        let cluster = Claimant::ClusterProjection { name: "fan".into() };
        let spec: ClusterProjectionSpec = serde_json::from_value(json!({
            "source": {"kind": "ConfigMap", "namespace": "z", "name": "cfg"},
            "destination": {"namespaces": ["b", "c"]}}))
        .unwrap();
        let claim = cluster_claim(&spec, &["b".into(), "c".into()]);
        let found = index.overlaps(&cluster, &claim);
        assert_eq!(found, [(cm("b", "cfg"), projection("b", "first"))]);
        assert_eq!(
            overlap_warning(&found[0].0, &found[0].1),
            "destination ConfigMap b/cfg is already claimed by Projection b/first; only one of them can write it"
        );
        // Re-admitting the same CR (an update) is no overlap with itself.
        let again = projection_claim("b", &projection_spec("a", "cfg", None));
        assert!(index.overlaps(&projection("b", "first"), &again).is_empty());
        // Another kind or name is another object.
        assert!(
            index
                .overlaps(
                    &projection("b", "x"),
                    &projection_claim("b", &projection_spec("a", "cfg", Some("other")))
                )
                .is_empty()
        );
        index.remove(&projection("b", "first"));
        assert!(index.overlaps(&cluster, &claim).is_empty());
        assert!(index.is_empty());
    }

    #[test]
    fn a_chain_back_into_the_source_is_a_loop_and_a_chain_elsewhere_is_not() {
        let mut index = ClaimIndex::default();
        // b/first: a/cfg -> b/cfg; c/second: b/cfg -> c/cfg.
        index.set(
            projection("b", "first"),
            projection_claim("b", &projection_spec("a", "cfg", None)),
        );
        index.set(
            projection("c", "second"),
            projection_claim("c", &projection_spec("b", "cfg", None)),
        );
        assert_eq!(index.len(), 2);
        // a/third: c/cfg -> a/cfg closes a -> b -> c -> a.
        let third = projection("a", "third");
        let claim = projection_claim("a", &projection_spec("c", "cfg", None));
        let chain = index.loop_through(&third, &claim).expect("a loop");
        let hops: Vec<String> = chain.iter().map(|h| h.claimant.to_string()).collect();
        assert_eq!(
            hops,
            ["Projection a/third", "Projection b/first", "Projection c/second"]
        );
        assert_eq!(
            loop_message(&chain),
            "this spec closes a loop of copies, each one the source of the next: Projection a/third copies \
             ConfigMap c/cfg to ConfigMap a/cfg, then Projection b/first copies ConfigMap a/cfg to ConfigMap \
             b/cfg, then Projection c/second copies ConfigMap b/cfg to ConfigMap c/cfg"
        );
        // The same chain ending elsewhere is no loop.
        let elsewhere = projection_claim("d", &projection_spec("c", "cfg", None));
        assert_eq!(index.loop_through(&projection("d", "fourth"), &elsewhere), None);
        // Two CRs copying each other's copy: the shortest loop.
        let mut two = ClaimIndex::default();
        two.set(
            projection("b", "p"),
            projection_claim("b", &projection_spec("a", "cfg", None)),
        );
        let back = projection_claim("a", &projection_spec("b", "cfg", None));
        let chain = two.loop_through(&projection("a", "q"), &back).expect("a loop");
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[0].to, cm("a", "cfg"));
        assert_eq!(chain[1].to, cm("b", "cfg"));
    }

    /// Resident memory of this process, in bytes (Linux), to show what the index costs.
    fn resident_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
        let pages: usize = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        pages * 4096
    }

    #[test]
    fn ten_thousand_claims_are_indexed() {
        let before = resident_bytes();
        let mut index = ClaimIndex::default();
        for i in 0..10_000 {
            let ns = format!("team-{i:05}");
            index.set(
                projection(&ns, "cfg"),
                projection_claim(&ns, &projection_spec("platform", "cfg", None)),
            );
        }
        assert_eq!(index.len(), 10_000);
        // Run alone (`cargo test -p shared --lib ten_thousand_claims -- --nocapture`) for a clean figure.
        println!(
            "10 000 claims: resident memory grew by {} KiB",
            resident_bytes().saturating_sub(before) / 1024
        );
        let new = projection_claim("platform-copy", &projection_spec("team-00042", "cfg", None));
        assert_eq!(index.loop_through(&projection("platform-copy", "x"), &new), None);
        let back = projection_claim("platform", &projection_spec("team-00042", "cfg", None));
        assert!(
            index
                .loop_through(&projection("platform", "loop"), &back)
                .is_some()
        );
    }
}
