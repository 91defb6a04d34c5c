//! The namespaces of the cluster as ClusterProjections see them (names, labels, whether they are
//! being deleted), and namespace → the ClusterProjections it concerns: those listing it by name, and
//! those whose selector matched its labels before or after an event. No scan of ClusterProjections
//! that list other namespaces.

use kube::runtime::reflector::ObjectRef;
use shared::{
    api::crd::ClusterProjection,
    pass::targets::{NamespaceInfo, TargetRule},
};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

type Cp = ObjectRef<ClusterProjection>;

/// The namespace cache and its index.
#[derive(Default)]
pub struct NamespaceIndex {
    namespaces: BTreeMap<String, NamespaceInfo>,
    /// Namespaces seen during a relist, swapped in when it completes.
    relisting: Option<BTreeMap<String, NamespaceInfo>>,
    rules: HashMap<Cp, Arc<TargetRule>>,
    listing: HashMap<String, HashSet<Cp>>,
    selecting: HashSet<Cp>,
}

impl NamespaceIndex {
    /// A (re)list starts.
    pub fn relist_started(&mut self) {
        self.relisting = Some(BTreeMap::new());
    }

    /// A namespace of the (re)list.
    pub fn relisted(&mut self, info: NamespaceInfo) {
        if let Some(relist) = self.relisting.as_mut() {
            relist.insert(info.name.clone(), info);
        }
    }

    /// The (re)list is complete: it replaces what was known. Returns the ClusterProjections to wake:
    /// all of them when anything changed while the watch was down.
    pub fn relist_done(&mut self) -> Vec<Cp> {
        let fresh = self.relisting.take().unwrap_or_default();
        let changed = fresh != self.namespaces;
        self.namespaces = fresh;
        if changed {
            self.rules.keys().cloned().collect()
        } else {
            Vec::new()
        }
    }

    /// A namespace was created or changed. Returns the ClusterProjections to wake.
    pub fn applied(&mut self, info: NamespaceInfo) -> Vec<Cp> {
        let old = self.namespaces.insert(info.name.clone(), info.clone());
        if old.as_ref() == Some(&info) {
            return Vec::new();
        }
        self.concerned(&info.name, old.as_ref(), Some(&info))
    }

    /// A namespace is gone. Returns the ClusterProjections to wake.
    pub fn deleted(&mut self, name: &str) -> Vec<Cp> {
        let old = self.namespaces.remove(name);
        self.concerned(name, old.as_ref(), None)
    }

    /// Every namespace now, without copying them.
    pub fn all(&self) -> impl Iterator<Item = &NamespaceInfo> {
        self.namespaces.values()
    }

    /// Records (or replaces) which namespaces `cp` targets.
    pub fn set_rule(&mut self, cp: &Cp, rule: Arc<TargetRule>) {
        self.forget(cp);
        match &*rule {
            TargetRule::List(names) => {
                for name in names {
                    self.listing.entry(name.clone()).or_default().insert(cp.clone());
                }
            }
            TargetRule::Selector(_) => {
                self.selecting.insert(cp.clone());
            }
        }
        self.rules.insert(cp.clone(), rule);
    }

    /// Forgets a ClusterProjection that is gone (or has no valid rule).
    pub fn forget(&mut self, cp: &Cp) {
        let Some(old) = self.rules.remove(cp) else { return };
        match &*old {
            TargetRule::List(names) => {
                for name in names {
                    if let Some(set) = self.listing.get_mut(name) {
                        set.remove(cp);
                        if set.is_empty() {
                            self.listing.remove(name);
                        }
                    }
                }
            }
            TargetRule::Selector(_) => {
                self.selecting.remove(cp);
            }
        }
    }

    /// The ClusterProjections that list `name`, or whose selector matched it before or matches it now.
    fn concerned(
        &self,
        name: &str,
        before: Option<&NamespaceInfo>,
        after: Option<&NamespaceInfo>,
    ) -> Vec<Cp> {
        let mut cps: Vec<Cp> = self.listing.get(name).into_iter().flatten().cloned().collect();
        for cp in &self.selecting {
            let Some(rule) = self.rules.get(cp) else { continue };
            if [before, after]
                .into_iter()
                .flatten()
                .any(|ns| rule.selects(name, &ns.labels))
            {
                cps.push(cp.clone());
            }
        }
        cps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(name: &str, labels: &[(&str, &str)]) -> NamespaceInfo {
        NamespaceInfo {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
            terminating: false,
        }
    }

    fn rule(destination: serde_json::Value) -> Arc<TargetRule> {
        Arc::new(TargetRule::of(&serde_json::from_value(destination).expect("destination")).expect("rule"))
    }

    fn names(mut cps: Vec<Cp>) -> Vec<String> {
        cps.sort_by(|a, b| a.name.cmp(&b.name));
        cps.into_iter().map(|cp| cp.name).collect()
    }

    fn index() -> NamespaceIndex {
        let mut ix = NamespaceIndex::default();
        ix.set_rule(&Cp::new("listing"), rule(json!({"namespaces": ["a", "b"]})));
        ix.set_rule(
            &Cp::new("selecting"),
            rule(json!({"namespaceSelector": {"matchLabels": {"tier": "prod"}}})),
        );
        ix
    }

    #[test]
    fn a_namespace_event_wakes_the_cluster_projections_it_concerns() {
        let mut ix = index();
        enum Step {
            Apply(NamespaceInfo),
            Delete(&'static str),
        }
        use Step::*;
        // (event, woken)
        let steps = [
            (Apply(ns("a", &[])), vec!["listing"]),
            (Apply(ns("a", &[])), vec![]),
            (Apply(ns("c", &[])), vec![]),
            (Apply(ns("c", &[("tier", "prod")])), vec!["selecting"]),
            // It left the selector: the ClusterProjection must remove its copy.
            (Apply(ns("c", &[("tier", "dev")])), vec!["selecting"]),
            (Apply(ns("b", &[("tier", "prod")])), vec!["listing", "selecting"]),
            (Delete("b"), vec!["listing", "selecting"]),
            (Delete("c"), vec![]),
        ];
        for (i, (step, woken)) in steps.into_iter().enumerate() {
            let got = match step {
                Apply(info) => ix.applied(info),
                Delete(name) => ix.deleted(name),
            };
            assert_eq!(names(got), woken, "step {i}");
        }
        assert_eq!(ix.all().map(|n| n.name.as_str()).collect::<Vec<_>>(), ["a"]);
    }

    #[test]
    fn a_relist_replaces_the_cache_and_wakes_all_when_it_changed() {
        let mut ix = index();
        ix.relist_started();
        ix.relisted(ns("a", &[]));
        assert!(ix.all().next().is_none(), "the first list counts once complete");
        assert_eq!(names(ix.relist_done()), ["listing", "selecting"]);
        ix.relist_started();
        ix.relisted(ns("a", &[]));
        assert!(ix.relist_done().is_empty(), "nothing changed");
        ix.relisted(ns("x", &[]));
        assert_eq!(ix.all().count(), 1, "outside a relist nothing is collected");
    }

    #[test]
    fn a_new_rule_replaces_the_old_and_forgetting_removes_it() {
        let mut ix = index();
        ix.set_rule(&Cp::new("listing"), rule(json!({"namespaces": ["z"]})));
        assert!(ix.applied(ns("a", &[])).is_empty());
        assert_eq!(names(ix.applied(ns("z", &[]))), ["listing"]);
        ix.forget(&Cp::new("listing"));
        ix.forget(&Cp::new("selecting"));
        ix.forget(&Cp::new("never-known"));
        assert!(ix.deleted("z").is_empty());
        assert!(ix.applied(ns("p", &[("tier", "prod")])).is_empty());
        assert!(ix.listing.is_empty() && ix.selecting.is_empty() && ix.rules.is_empty());
    }
}
