//! The identity of a cluster, as copies written from it into other clusters carry it
//! (`projection.sh/source-cluster`): the About API's `cluster.clusterset.k8s.io` ClusterProperty
//! where the cluster serves it (KEP-2149: a cluster's ID in its ClusterSet), else the UID of its
//! `kube-system` namespace. Read alike by the controller, which stamps it, and by
//! `kubectl projection`, which checks a context against it.

use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject},
};

/// The name of the About API property that names a cluster.
pub const CLUSTER_PROPERTY: &str = "cluster.clusterset.k8s.io";

/// The cluster `client` reaches, by its identity.
pub async fn read(client: &Client) -> Result<String, kube::Error> {
    let properties = ApiResource {
        group: "about.k8s.io".into(),
        version: "v1alpha1".into(),
        api_version: "about.k8s.io/v1alpha1".into(),
        kind: "ClusterProperty".into(),
        plural: "clusterproperties".into(),
    };
    let property = match Api::<DynamicObject>::all_with(client.clone(), &properties)
        .get_opt(CLUSTER_PROPERTY)
        .await
    {
        Ok(found) => found,
        // Not served (404), or not readable by us (403): the namespace's UID names the cluster.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 403 => None,
        Err(e) => return Err(e),
    };
    let value = property.and_then(|p| p.data["spec"]["value"].as_str().map(str::to_owned));
    let namespaces = ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Namespace".into(),
        plural: "namespaces".into(),
    };
    let kube_system = match value {
        Some(_) => None,
        None => {
            Api::<DynamicObject>::all_with(client.clone(), &namespaces)
                .get("kube-system")
                .await?
                .metadata
                .uid
        }
    };
    Ok(identity_of(value.as_deref(), kube_system.as_deref()))
}

/// The identity from what was read: the property's value when set, else the namespace's UID.
fn identity_of(property: Option<&str>, kube_system_uid: Option<&str>) -> String {
    property
        .filter(|v| !v.is_empty())
        .or(kube_system_uid)
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_property_names_the_cluster_where_set_else_kube_system() {
        assert_eq!(identity_of(Some("eu-1"), Some("uid")), "eu-1");
        assert_eq!(identity_of(Some(""), Some("uid")), "uid");
        assert_eq!(identity_of(None, Some("uid")), "uid");
        assert_eq!(identity_of(None, None), "");
    }
}
