//! The self-managed certificate's pure parts: what the serving certificate must name, whether the CA
//! or the serving pair needs a new issue at a given instant (and why), issuing them, and the
//! caBundle the webhook configurations must carry. No I/O: `self_managed` reads and writes the
//! Secret and the configurations around these functions.
//!
//! The Secret holds `ca.crt` (the current CA first, then earlier CAs that have not expired yet),
//! `ca.key` (the current CA's key), `tls.crt` and `tls.key` (the serving pair). A CA rotation
//! happens in two steps, so the apiserver never meets a serving certificate from a CA that is not
//! in its caBundle: first a new CA is added in front of the old one (the serving pair, still
//! issued by the old CA, stays; the caBundle now holds both), then, [`CA_PUBLISH_DELAY`] later,
//! the serving pair is issued anew by the new CA (`Lifetimes::ca_publish_delay`, by default
//! [`CA_PUBLISH_DELAY`]).

use crate::error::CertError;
use base64::{Engine as _, engine::general_purpose::STANDARD};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Duration, SystemTime},
};

/// Data keys of the Secret (type `kubernetes.io/tls`).
pub const TLS_CRT: &str = "tls.crt";
/// See [`TLS_CRT`].
pub const TLS_KEY: &str = "tls.key";
/// See [`TLS_CRT`].
pub const CA_CRT: &str = "ca.crt";
/// See [`TLS_CRT`].
pub const CA_KEY: &str = "ca.key";

/// New certificates start this long before they are issued, so a peer whose clock is a little
/// behind does not find them "not yet valid".
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// How long a new CA is only published (in the caBundle, next to the previous one) before serving
/// certificates are issued by it, unless set otherwise: time for every replica to patch the
/// webhook configurations and for the apiserver to pick them up.
pub const CA_PUBLISH_DELAY: Duration = Duration::from_secs(60);

/// A serving certificate with more names than the flags ask for is issued anew for exactly those
/// this long after its issue: long enough that replicas of two versions (a rollout changing the
/// names) do not take turns rewriting it, short enough that a removed name goes soon after.
pub const NAMES_SETTLE: Duration = Duration::from_secs(10 * 60);

/// The names the serving certificate carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubjectNames {
    /// DNS names.
    pub dns: BTreeSet<String>,
    /// IP addresses.
    pub ips: BTreeSet<IpAddr>,
}

impl SubjectNames {
    /// The names of Service `service` in `namespace` (`NAME`, `NAME.NS`, `NAME.NS.svc`,
    /// `NAME.NS.svc.DOMAIN`) plus `extra` (DNS names or IP addresses). An invalid extra name, or
    /// domain, is returned as the error.
    pub fn for_service(
        service: &str,
        namespace: &str,
        domain: &str,
        extra: &[String],
    ) -> Result<Self, String> {
        let domain = domain.trim_end_matches('.');
        if !is_dns_name(domain) {
            return Err(domain.to_owned());
        }
        let mut names = Self::default();
        for name in [
            service.to_owned(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.{domain}"),
        ] {
            names.dns.insert(name);
        }
        for value in extra.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
            if let Ok(ip) = value.parse::<IpAddr>() {
                names.ips.insert(ip);
            } else if is_dns_name(value) {
                names.dns.insert(value.to_ascii_lowercase());
            } else {
                return Err(value.to_owned());
            }
        }
        Ok(names)
    }

    /// Whether every name of `self` is one of `other`'s.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.dns.is_subset(&other.dns) && self.ips.is_subset(&other.ips)
    }

    /// The names of both.
    pub fn union(&self, other: &Self) -> Self {
        Self {
            dns: self.dns.union(&other.dns).cloned().collect(),
            ips: self.ips.union(&other.ips).copied().collect(),
        }
    }

    fn subject_alt_names(&self) -> Result<Vec<SanType>, CertError> {
        let mut sans = Vec::new();
        for name in &self.dns {
            let name = name
                .clone()
                .try_into()
                .map_err(|e: rcgen::Error| CertError::Generate(e.to_string()))?;
            sans.push(SanType::DnsName(name));
        }
        sans.extend(self.ips.iter().map(|ip| SanType::IpAddress(*ip)));
        Ok(sans)
    }
}

/// Letters, digits and `-` in dot-separated labels of at most 63, at most 253 in all; a leading
/// `*.` is allowed (a wildcard name).
fn is_dns_name(value: &str) -> bool {
    let value = value.strip_prefix("*.").unwrap_or(value);
    !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// How long certificates live and when they are renewed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    /// Validity of a serving certificate.
    pub validity: Duration,
    /// A certificate (serving or CA) is renewed this long before it expires.
    pub renew_before: Duration,
    /// Validity of a CA.
    pub ca_validity: Duration,
    /// How long a new CA is published before serving certificates are issued by it.
    pub ca_publish_delay: Duration,
}

/// The four values of the Secret; a missing key is empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Material {
    /// PEM serving certificate.
    pub tls_crt: Vec<u8>,
    /// PEM key of the serving certificate.
    pub tls_key: Vec<u8>,
    /// PEM CA certificates: the current one first, then earlier ones not yet expired.
    pub ca_crt: Vec<u8>,
    /// PEM key of the current CA.
    pub ca_key: Vec<u8>,
}

/// Why a certificate is issued anew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IssueReason {
    /// Not there at all.
    Missing,
    /// Not parseable, or the key does not belong to the certificate.
    Invalid(String),
    /// Inside its renewal window (or past its end).
    Expiring,
    /// The serving certificate lacks a name of the flags: it is issued for its names and the
    /// flags' (so replicas of two versions during a rollout agree instead of taking turns).
    NamesMissing,
    /// The serving certificate has names the flags do not ask for (any more), and was issued more
    /// than [`NAMES_SETTLE`] ago: it is issued for exactly the flags' names.
    NamesExtra,
    /// The serving certificate was not issued by any CA of `ca.crt`.
    NotIssuedByCa,
    /// The CA it was issued by is about to expire.
    IssuerExpiring,
    /// Issued by the previous CA, and the current one has been published long enough.
    IssuedByPreviousCa,
    /// The CA was replaced: nothing it issued is trusted any more.
    CaReplaced,
}

impl IssueReason {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Invalid(_) => "invalid",
            Self::Expiring => "expiring",
            Self::NamesMissing => "names_missing",
            Self::NamesExtra => "names_extra",
            Self::NotIssuedByCa => "not_issued_by_ca",
            Self::IssuerExpiring => "issuer_expiring",
            Self::IssuedByPreviousCa => "issued_by_previous_ca",
            Self::CaReplaced => "ca_replaced",
        }
    }
}

impl std::fmt::Display for IssueReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Invalid(why) => write!(f, "invalid: {why}"),
            other => f.write_str(other.category()),
        }
    }
}

/// What to do with the CA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CaPlan {
    /// It stays.
    Keep,
    /// A new CA goes in front; the earlier ones stay in `ca.crt` until they expire.
    Rotate(IssueReason),
    /// The CA is unusable: a new one replaces it and everything in `ca.crt`.
    Replace(IssueReason),
}

/// What to do with the serving pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServingPlan {
    /// It stays.
    Keep,
    /// A new pair is issued by the current (or new) CA.
    Issue(IssueReason),
}

/// The verdict on a Secret's contents at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    /// The CA.
    pub ca: CaPlan,
    /// The serving pair.
    pub serving: ServingPlan,
    /// When the verdict may change with no change of the Secret (a renewal window opens).
    pub next_check: SystemTime,
}

impl Assessment {
    /// Whether the Secret can be served as it is.
    pub fn is_current(&self) -> bool {
        self.ca == CaPlan::Keep && self.serving == ServingPlan::Keep
    }
}

/// What is read from one certificate.
#[derive(Clone, Debug)]
pub struct CertFacts {
    /// DER.
    pub der: Vec<u8>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
    /// Its subject alternative names.
    pub names: SubjectNames,
    /// Whether it is a CA (basicConstraints CA:TRUE).
    pub is_ca: bool,
    /// The subject public key (the BIT STRING's content).
    pub public_key: Vec<u8>,
}

fn system_time(seconds: i64) -> SystemTime {
    match u64::try_from(seconds) {
        Ok(s) => SystemTime::UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => SystemTime::UNIX_EPOCH - Duration::from_secs(seconds.unsigned_abs()),
    }
}

/// Reads validity, names, CA flag and public key of a DER certificate.
pub fn cert_facts(der: &[u8]) -> Result<CertFacts, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| format!("certificate: {e}"))?;
    let mut names = SubjectNames::default();
    if let Some(san) = cert
        .subject_alternative_name()
        .map_err(|e| format!("subjectAltName: {e}"))?
    {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => {
                    names.dns.insert(dns.to_ascii_lowercase());
                }
                x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).map(IpAddr::from).ok(),
                        16 => <[u8; 16]>::try_from(*bytes).map(IpAddr::from).ok(),
                        _ => None,
                    };
                    names.ips.extend(ip);
                }
                _ => {}
            }
        }
    }
    Ok(CertFacts {
        der: der.to_vec(),
        not_before: system_time(cert.validity().not_before.timestamp()),
        not_after: system_time(cert.validity().not_after.timestamp()),
        names,
        is_ca: cert.is_ca(),
        public_key: cert.public_key().subject_public_key.data.to_vec(),
    })
}

/// Whether `issuer` signed `cert` (both DER).
pub fn issued_by(cert: &[u8], issuer: &[u8]) -> bool {
    let (Ok((_, cert)), Ok((_, issuer))) = (
        x509_parser::parse_x509_certificate(cert),
        x509_parser::parse_x509_certificate(issuer),
    ) else {
        return false;
    };
    cert.issuer() == issuer.subject() && cert.verify_signature(Some(issuer.public_key())).is_ok()
}

/// The certificates of a PEM bundle, DER; fails if one is malformed or there is none.
pub fn pem_certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("PEM: {e}"))?;
    if certs.is_empty() {
        return Err("no certificate in the PEM".into());
    }
    Ok(certs)
}

/// A PEM key pair whose public key is `public_key`.
fn key_for(key_pem: &[u8], public_key: &[u8]) -> Result<KeyPair, String> {
    let pem = std::str::from_utf8(key_pem).map_err(|_| "key: not UTF-8".to_owned())?;
    let key = KeyPair::from_pem(pem).map_err(|e| format!("key: {e}"))?;
    if key.public_key_raw() != public_key {
        return Err("the key does not belong to the certificate".into());
    }
    Ok(key)
}

/// The CA part of a Secret, as far as it is usable.
struct CaView {
    /// The first certificate of `ca.crt`, with `ca.key`.
    current: CertFacts,
    /// The other parseable certificates of `ca.crt`.
    previous: Vec<CertFacts>,
}

fn read_ca(material: &Material) -> Result<CaView, IssueReason> {
    if material.ca_crt.is_empty() || material.ca_key.is_empty() {
        return Err(IssueReason::Missing);
    }
    let ders = pem_certificates(&material.ca_crt).map_err(IssueReason::Invalid)?;
    let current = cert_facts(&ders[0]).map_err(IssueReason::Invalid)?;
    if !current.is_ca {
        return Err(IssueReason::Invalid(
            "the first certificate of ca.crt is not a CA".into(),
        ));
    }
    key_for(&material.ca_key, &current.public_key).map_err(IssueReason::Invalid)?;
    let previous = ders[1..]
        .iter()
        .filter_map(|der| cert_facts(der).ok())
        .filter(|c| c.is_ca)
        .collect();
    Ok(CaView { current, previous })
}

/// Decides, at `now`, whether the CA and the serving pair in `material` can stay, and when to look
/// again.
pub fn assess(
    now: SystemTime,
    material: &Material,
    names: &SubjectNames,
    lifetimes: &Lifetimes,
) -> Assessment {
    let renew_at = |not_after: SystemTime, before: Duration| {
        not_after.checked_sub(before).unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let mut next_check = now + lifetimes.ca_validity;
    let ca = match read_ca(material) {
        Err(reason) => Err(reason),
        Ok(ca) if ca.current.not_after <= now => Err(IssueReason::Expiring),
        Ok(ca) => Ok(ca),
    };
    let (ca_plan, ca) = match ca {
        Err(reason) => {
            return Assessment {
                ca: CaPlan::Replace(reason),
                serving: ServingPlan::Issue(IssueReason::CaReplaced),
                next_check: now,
            };
        }
        Ok(ca) => {
            let due = renew_at(ca.current.not_after, lifetimes.renew_before);
            if due <= now {
                (CaPlan::Rotate(IssueReason::Expiring), ca)
            } else {
                next_check = next_check.min(due);
                (CaPlan::Keep, ca)
            }
        }
    };
    let serving = match assess_serving(now, material, names, lifetimes, &ca, &ca_plan) {
        Ok(next) => {
            next_check = next_check.min(next);
            ServingPlan::Keep
        }
        Err(reason) => ServingPlan::Issue(reason),
    };
    if ca_plan != CaPlan::Keep || serving != ServingPlan::Keep {
        next_check = now;
    }
    Assessment {
        ca: ca_plan,
        serving,
        next_check,
    }
}

/// `Ok(when to look again)` if the serving pair can stay, else why it must be issued anew.
fn assess_serving(
    now: SystemTime,
    material: &Material,
    names: &SubjectNames,
    lifetimes: &Lifetimes,
    ca: &CaView,
    ca_plan: &CaPlan,
) -> Result<SystemTime, IssueReason> {
    if material.tls_crt.is_empty() || material.tls_key.is_empty() {
        return Err(IssueReason::Missing);
    }
    let ders = pem_certificates(&material.tls_crt).map_err(IssueReason::Invalid)?;
    let leaf = cert_facts(&ders[0]).map_err(IssueReason::Invalid)?;
    key_for(&material.tls_key, &leaf.public_key).map_err(IssueReason::Invalid)?;
    if !names.is_subset(&leaf.names) {
        return Err(IssueReason::NamesMissing);
    }
    let issuer = std::iter::once(&ca.current)
        .chain(&ca.previous)
        .find(|issuer| issued_by(&leaf.der, &issuer.der))
        .ok_or(IssueReason::NotIssuedByCa)?;
    let renew = leaf
        .not_after
        .checked_sub(lifetimes.renew_before)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if renew <= now {
        return Err(IssueReason::Expiring);
    }
    // A safety net: normally the serving pair moves to the new CA long before its issuer expires.
    let issuer_due = issuer
        .not_after
        .checked_sub(lifetimes.renew_before / 2)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    if issuer_due <= now {
        return Err(IssueReason::IssuerExpiring);
    }
    let mut next = renew.min(issuer_due);
    if &leaf.names != names {
        let settled = leaf.not_before + BACKDATE + NAMES_SETTLE;
        if settled <= now {
            return Err(IssueReason::NamesExtra);
        }
        next = next.min(settled);
    }
    if issuer.der != ca.current.der && *ca_plan == CaPlan::Keep {
        let published = ca.current.not_before + BACKDATE + lifetimes.ca_publish_delay;
        if published <= now {
            return Err(IssueReason::IssuedByPreviousCa);
        }
        next = next.min(published);
    }
    Ok(next)
}

/// A new CA, PEM certificate and key.
fn new_ca(now: SystemTime, validity: Duration) -> Result<(String, String), CertError> {
    let key = KeyPair::generate().map_err(generate_error)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    let since_epoch = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    dn.push(
        DnType::CommonName,
        format!("projection-webhook-ca@{}", since_epoch.as_secs()),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + validity).into();
    let cert = params.self_signed(&key).map_err(generate_error)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new serving pair issued by the CA `ca_der` with key `ca_key_pem`, PEM certificate and key.
fn new_serving(
    now: SystemTime,
    validity: Duration,
    names: &SubjectNames,
    ca_der: &[u8],
    ca_key_pem: &str,
) -> Result<(String, String), CertError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(generate_error)?;
    let issuer = Issuer::from_ca_cert_der(&CertificateDer::from(ca_der), ca_key).map_err(generate_error)?;
    let key = KeyPair::generate().map_err(generate_error)?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    if let Some(first) = names.dns.iter().min_by_key(|n| n.len()) {
        dn.push(DnType::CommonName, first.as_str());
    }
    params.distinguished_name = dn;
    params.subject_alt_names = names.subject_alt_names()?;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = (now - BACKDATE).into();
    params.not_after = (now + validity).into();
    let cert = params.signed_by(&key, &issuer).map_err(generate_error)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn generate_error(e: rcgen::Error) -> CertError {
    CertError::Generate(e.to_string())
}

/// One certificate as PEM (LF line endings, as rcgen writes them).
fn pem_of(der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new("CERTIFICATE", der),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// Carries out `assessment` on `material`: the Secret's new contents. Earlier CAs stay in `ca.crt`
/// until they expire.
pub fn renew(
    now: SystemTime,
    material: &Material,
    assessment: &Assessment,
    names: &SubjectNames,
    lifetimes: &Lifetimes,
) -> Result<Material, CertError> {
    let mut next = material.clone();
    let kept_cas: Vec<Vec<u8>> = match &assessment.ca {
        CaPlan::Keep => Vec::new(),
        CaPlan::Replace(_) => {
            let (crt, key) = new_ca(now, lifetimes.ca_validity)?;
            next.ca_crt = crt.into_bytes();
            next.ca_key = key.into_bytes();
            Vec::new()
        }
        CaPlan::Rotate(_) => {
            let previous = pem_certificates(&material.ca_crt).unwrap_or_default();
            let (crt, key) = new_ca(now, lifetimes.ca_validity)?;
            next.ca_crt = crt.into_bytes();
            next.ca_key = key.into_bytes();
            previous
        }
    };
    // ca.crt: the current CA, then every other parseable, unexpired CA, once each.
    let all = pem_certificates(&next.ca_crt).map_err(CertError::Inconsistent)?;
    let current = all[0].clone();
    let mut bundle = vec![current.clone()];
    for der in all.into_iter().skip(1).chain(kept_cas) {
        let alive = cert_facts(&der).is_ok_and(|c| c.is_ca && c.not_after > now);
        if alive && !bundle.contains(&der) {
            bundle.push(der);
        }
    }
    next.ca_crt = bundle
        .iter()
        .map(|der| pem_of(der))
        .collect::<String>()
        .into_bytes();
    if let ServingPlan::Issue(reason) = &assessment.serving {
        let key = std::str::from_utf8(&next.ca_key)
            .map_err(|_| CertError::Inconsistent("ca.key is not UTF-8".into()))?;
        let names = match reason {
            IssueReason::NamesMissing => pem_certificates(&material.tls_crt)
                .ok()
                .and_then(|ders| cert_facts(&ders[0]).ok())
                .map_or_else(|| names.clone(), |leaf| names.union(&leaf.names)),
            _ => names.clone(),
        };
        let (crt, key) = new_serving(now, lifetimes.validity, &names, &current, key)?;
        next.tls_crt = crt.into_bytes();
        next.tls_key = key.into_bytes();
    }
    Ok(next)
}

/// The caBundle for `ca_crt`: every parseable CA certificate of it, PEM, in order, once each.
/// Every replica derives it from the same Secret, so they all want the same bundle.
pub fn ca_bundle(ca_crt: &[u8]) -> Result<Vec<u8>, String> {
    let mut seen = Vec::new();
    for der in pem_certificates(ca_crt)? {
        if cert_facts(&der).is_ok_and(|c| c.is_ca) && !seen.contains(&der) {
            seen.push(der);
        }
    }
    if seen.is_empty() {
        return Err("ca.crt holds no CA certificate".into());
    }
    Ok(seen
        .iter()
        .map(|der| pem_of(der))
        .collect::<String>()
        .into_bytes())
}

/// One webhook entry of a Validating- or MutatingWebhookConfiguration: its name and caBundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookEntry<'a> {
    /// `webhooks[i].name`.
    pub name: &'a str,
    /// `webhooks[i].clientConfig.caBundle`, decoded.
    pub ca_bundle: Option<&'a [u8]>,
}

/// The JSON patch setting `bundle` as caBundle of every entry that holds another one, or `None`
/// when all hold it. Each change is guarded by a `test` of the entry's name, so a list reordered in
/// between makes the patch fail instead of writing the wrong entry.
pub fn ca_bundle_patch(entries: &[WebhookEntry<'_>], bundle: &[u8]) -> Option<json_patch::Patch> {
    use json_patch::{AddOperation, PatchOperation, TestOperation};
    // Standard base64, as the apiserver's JSON carries `[]byte` fields.
    let encoded = STANDARD.encode(bundle);
    let mut operations = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        if entry.ca_bundle == Some(bundle) {
            continue;
        }
        let index = i.to_string();
        let path = |suffix: &[&str]| {
            json_patch::jsonptr::PointerBuf::from_tokens(
                ["webhooks", index.as_str()]
                    .into_iter()
                    .chain(suffix.iter().copied()),
            )
        };
        operations.push(PatchOperation::Test(TestOperation {
            path: path(&["name"]),
            value: serde_json::Value::String(entry.name.to_owned()),
        }));
        operations.push(PatchOperation::Add(AddOperation {
            path: path(&["clientConfig", "caBundle"]),
            value: serde_json::Value::String(encoded.clone()),
        }));
    }
    (!operations.is_empty()).then_some(json_patch::Patch(operations))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);
    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn names() -> SubjectNames {
        SubjectNames::for_service("webhook", "system", "cluster.local", &["127.0.0.1".into()]).expect("names")
    }

    fn lifetimes() -> Lifetimes {
        Lifetimes {
            validity: 365 * DAY,
            renew_before: 30 * DAY,
            ca_validity: 3650 * DAY,
            ca_publish_delay: CA_PUBLISH_DELAY,
        }
    }

    fn t0() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
    }

    /// A fresh Secret's contents issued at `now`.
    fn fresh(now: SystemTime) -> Material {
        let assessment = assess(now, &Material::default(), &names(), &lifetimes());
        renew(now, &Material::default(), &assessment, &names(), &lifetimes()).expect("issued")
    }

    #[test]
    fn service_names_follow_the_flags() {
        let names = SubjectNames::for_service(
            "hook",
            "ns",
            "example.org.",
            &["10.0.0.1".into(), "Hook.Example.com".into(), " ".into()],
        )
        .expect("valid");
        assert_eq!(
            names.dns.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "hook",
                "hook.example.com",
                "hook.ns",
                "hook.ns.svc",
                "hook.ns.svc.example.org"
            ]
        );
        assert_eq!(names.ips.len(), 1);
        assert_eq!(
            SubjectNames::for_service("hook", "ns", "cluster.local", &["a b".into()]),
            Err("a b".into())
        );
        assert_eq!(
            SubjectNames::for_service("hook", "ns", "bad_domain", &[]),
            Err("bad_domain".into())
        );
    }

    #[test]
    fn an_empty_secret_gets_a_ca_and_a_serving_pair() {
        let assessment = assess(t0(), &Material::default(), &names(), &lifetimes());
        assert_eq!(assessment.ca, CaPlan::Replace(IssueReason::Missing));
        assert_eq!(assessment.serving, ServingPlan::Issue(IssueReason::CaReplaced));
        assert_eq!(assessment.next_check, t0());
    }

    #[test]
    fn issued_material_is_current_until_its_renewal_window() {
        let material = fresh(t0());
        let later = assess(t0() + HOUR, &material, &names(), &lifetimes());
        assert!(later.is_current(), "{later:?}");
        // The serving certificate's window opens first.
        assert_eq!(later.next_check, t0() + 365 * DAY - 30 * DAY);

        let leaf = cert_facts(&pem_certificates(&material.tls_crt).expect("PEM")[0]).expect("parses");
        assert_eq!(leaf.names, names());
        assert!(!leaf.is_ca);
        assert_eq!(leaf.not_before, t0() - BACKDATE);
        assert_eq!(leaf.not_after, t0() + 365 * DAY);
        let ca = cert_facts(&pem_certificates(&material.ca_crt).expect("PEM")[0]).expect("parses");
        assert!(ca.is_ca);
        assert_eq!(ca.not_after, t0() + 3650 * DAY);
        assert!(issued_by(&leaf.der, &ca.der));
        assert!(!issued_by(&ca.der, &leaf.der));
    }

    #[test]
    fn the_serving_pair_is_renewed_inside_its_window_and_keeps_the_ca() {
        let material = fresh(t0());
        let at = t0() + 335 * DAY + Duration::from_secs(1);
        let assessment = assess(at, &material, &names(), &lifetimes());
        assert_eq!(assessment.ca, CaPlan::Keep);
        assert_eq!(assessment.serving, ServingPlan::Issue(IssueReason::Expiring));
        let renewed = renew(at, &material, &assessment, &names(), &lifetimes()).expect("renewed");
        assert_eq!(renewed.ca_crt, material.ca_crt);
        assert_eq!(renewed.ca_key, material.ca_key);
        assert_ne!(renewed.tls_crt, material.tls_crt);
        assert!(assess(at, &renewed, &names(), &lifetimes()).is_current());
    }

    #[test]
    fn changed_names_missing_or_broken_pairs_are_issued_anew() {
        let material = fresh(t0());
        let other = SubjectNames::for_service("webhook", "elsewhere", "cluster.local", &[]).expect("names");
        assert_eq!(
            assess(t0(), &material, &other, &lifetimes()).serving,
            ServingPlan::Issue(IssueReason::NamesMissing)
        );

        let mut missing = material.clone();
        missing.tls_key.clear();
        assert_eq!(
            assess(t0(), &missing, &names(), &lifetimes()).serving,
            ServingPlan::Issue(IssueReason::Missing)
        );

        let mut garbage = material.clone();
        garbage.tls_crt = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".to_vec();
        assert!(matches!(
            assess(t0(), &garbage, &names(), &lifetimes()).serving,
            ServingPlan::Issue(IssueReason::Invalid(_))
        ));

        // A key from another pair.
        let mut mismatched = material.clone();
        mismatched.tls_key = fresh(t0()).tls_key;
        let assessment = assess(t0(), &mismatched, &names(), &lifetimes());
        assert_eq!(assessment.ca, CaPlan::Keep);
        assert_eq!(
            assessment.serving,
            ServingPlan::Issue(IssueReason::Invalid(
                "the key does not belong to the certificate".into()
            ))
        );

        // A pair another CA issued.
        let mut foreign = material.clone();
        let stranger = fresh(t0());
        foreign.tls_crt = stranger.tls_crt;
        foreign.tls_key = stranger.tls_key;
        assert_eq!(
            assess(t0(), &foreign, &names(), &lifetimes()).serving,
            ServingPlan::Issue(IssueReason::NotIssuedByCa)
        );
    }

    #[test]
    fn replicas_wanting_other_names_agree_and_extra_names_go_once_settled() {
        // A rollout: the old version wants `old`, the new one `new`.
        let old = names();
        let new = SubjectNames::for_service("webhook", "system", "corp.internal", &[]).expect("names");
        let material = fresh(t0());
        let a = assess(t0(), &material, &new, &lifetimes());
        assert_eq!(a.serving, ServingPlan::Issue(IssueReason::NamesMissing));
        let both = renew(t0(), &material, &a, &new, &lifetimes()).expect("renewed");
        let leaf = cert_facts(&pem_certificates(&both.tls_crt).expect("PEM")[0]).expect("parses");
        assert_eq!(leaf.names, old.union(&new), "issued for both versions' names");
        // Neither version renews it again while both run...
        for wanted in [&old, &new] {
            let verdict = assess(t0() + HOUR / 60, &both, wanted, &lifetimes());
            assert!(verdict.is_current(), "{verdict:?}");
            assert_eq!(verdict.next_check, t0() + NAMES_SETTLE);
        }
        // ...and once settled, the names of whoever is left are issued exactly.
        let later = t0() + NAMES_SETTLE;
        let a = assess(later, &both, &new, &lifetimes());
        assert_eq!(a.serving, ServingPlan::Issue(IssueReason::NamesExtra));
        let exact = renew(later, &both, &a, &new, &lifetimes()).expect("renewed");
        let leaf = cert_facts(&pem_certificates(&exact.tls_crt).expect("PEM")[0]).expect("parses");
        assert_eq!(leaf.names, new);
        assert!(assess(later, &exact, &new, &lifetimes()).is_current());
    }

    #[test]
    fn an_unusable_ca_is_replaced_with_everything_it_issued() {
        let material = fresh(t0());
        let mut wrong_key = material.clone();
        wrong_key.ca_key = fresh(t0()).ca_key;
        let assessment = assess(t0(), &wrong_key, &names(), &lifetimes());
        assert!(
            matches!(assessment.ca, CaPlan::Replace(IssueReason::Invalid(_))),
            "{assessment:?}"
        );
        assert_eq!(assessment.serving, ServingPlan::Issue(IssueReason::CaReplaced));
        let replaced = renew(t0(), &wrong_key, &assessment, &names(), &lifetimes()).expect("renewed");
        assert_eq!(pem_certificates(&replaced.ca_crt).expect("PEM").len(), 1);
        assert!(assess(t0(), &replaced, &names(), &lifetimes()).is_current());

        let mut leaf_as_ca = material.clone();
        leaf_as_ca.ca_crt = material.tls_crt.clone();
        leaf_as_ca.ca_key = material.tls_key.clone();
        assert!(matches!(
            assess(t0(), &leaf_as_ca, &names(), &lifetimes()).ca,
            CaPlan::Replace(IssueReason::Invalid(_))
        ));

        let expired = assess(t0() + 3651 * DAY, &material, &names(), &lifetimes());
        assert_eq!(expired.ca, CaPlan::Replace(IssueReason::Expiring));
    }

    #[test]
    fn a_ca_rotation_publishes_the_new_ca_before_the_serving_pair_moves_to_it() {
        let lifetimes = lifetimes();
        let material = fresh(t0());
        let old_ca = pem_certificates(&material.ca_crt).expect("PEM")[0].clone();

        // Step 1: inside the CA's window, a new CA goes in front; the serving pair stays.
        let t1 = t0() + 3650 * DAY - 30 * DAY + HOUR;
        // (the serving pair was renewed along the way; take one issued recently by the old CA)
        let recent = {
            let a = Assessment {
                ca: CaPlan::Keep,
                serving: ServingPlan::Issue(IssueReason::Expiring),
                next_check: t1,
            };
            renew(t1 - 10 * DAY, &material, &a, &names(), &lifetimes).expect("renewed")
        };
        let step1 = assess(t1, &recent, &names(), &lifetimes);
        assert_eq!(step1.ca, CaPlan::Rotate(IssueReason::Expiring));
        assert_eq!(step1.serving, ServingPlan::Keep);
        let rotated = renew(t1, &recent, &step1, &names(), &lifetimes).expect("rotated");
        assert_eq!(rotated.tls_crt, recent.tls_crt, "the serving pair stays");
        let cas = pem_certificates(&rotated.ca_crt).expect("PEM");
        assert_eq!(cas.len(), 2);
        assert_eq!(cas[1], old_ca, "the old CA stays published");
        let bundle = ca_bundle(&rotated.ca_crt).expect("bundle");
        assert_eq!(pem_certificates(&bundle).expect("PEM"), cas);

        // Until the new CA has been published long enough, nothing changes.
        let waiting = assess(t1 + Duration::from_secs(10), &rotated, &names(), &lifetimes);
        assert!(waiting.is_current(), "{waiting:?}");
        let published = t1 + CA_PUBLISH_DELAY;
        assert_eq!(waiting.next_check, published);

        // Step 2: then the serving pair moves to the new CA; the old one stays in the bundle.
        let step2 = assess(published, &rotated, &names(), &lifetimes);
        assert_eq!(step2.ca, CaPlan::Keep);
        assert_eq!(step2.serving, ServingPlan::Issue(IssueReason::IssuedByPreviousCa));
        let moved = renew(published, &rotated, &step2, &names(), &lifetimes).expect("moved");
        let leaf = &pem_certificates(&moved.tls_crt).expect("PEM")[0];
        assert!(issued_by(leaf, &cas[0]));
        assert_eq!(pem_certificates(&moved.ca_crt).expect("PEM"), cas);
        assert!(assess(published, &moved, &names(), &lifetimes).is_current());

        // Once the old CA has expired, the next write drops it.
        let after = t0() + 3650 * DAY + HOUR;
        let renewal = Assessment {
            ca: CaPlan::Keep,
            serving: ServingPlan::Issue(IssueReason::Expiring),
            next_check: after,
        };
        let pruned = renew(after, &moved, &renewal, &names(), &lifetimes).expect("renewed");
        assert_eq!(pem_certificates(&pruned.ca_crt).expect("PEM"), cas[..1]);
    }

    #[test]
    fn a_serving_pair_whose_issuer_expires_soon_is_renewed() {
        let lifetimes = Lifetimes {
            validity: 20 * DAY,
            renew_before: 10 * DAY,
            ca_validity: 100 * DAY,
            ca_publish_delay: CA_PUBLISH_DELAY,
        };
        let material = {
            let a = assess(t0(), &Material::default(), &names(), &lifetimes);
            renew(t0(), &Material::default(), &a, &names(), &lifetimes).expect("issued")
        };
        // Issued late in the CA's life, outliving it.
        let late = t0() + 93 * DAY;
        let a = Assessment {
            ca: CaPlan::Keep,
            serving: ServingPlan::Issue(IssueReason::Expiring),
            next_check: late,
        };
        let late_pair = renew(late, &material, &a, &names(), &lifetimes).expect("issued");
        // No rotation of the CA (as if it had not happened): the safety net renews.
        let mut frozen = late_pair.clone();
        frozen.ca_crt = material.ca_crt.clone();
        let at = t0() + 96 * DAY;
        let verdict = assess(at, &frozen, &names(), &lifetimes);
        assert_eq!(verdict.ca, CaPlan::Rotate(IssueReason::Expiring));
        assert_eq!(verdict.serving, ServingPlan::Issue(IssueReason::IssuerExpiring));
    }

    #[test]
    fn the_bundle_lists_each_ca_once_and_skips_other_certificates() {
        let a = fresh(t0());
        let b = fresh(t0());
        let mut both = a.ca_crt.clone();
        both.extend_from_slice(&b.ca_crt);
        both.extend_from_slice(&a.ca_crt);
        both.extend_from_slice(&a.tls_crt);
        let bundle = ca_bundle(&both).expect("bundle");
        let certs = pem_certificates(&bundle).expect("PEM");
        assert_eq!(certs.len(), 2);
        assert_eq!(ca_bundle(&a.ca_crt).expect("bundle"), a.ca_crt, "already normal");
        assert!(ca_bundle(b"").is_err());
        assert!(ca_bundle(&a.tls_crt).is_err());
    }

    #[test]
    fn the_patch_touches_only_entries_whose_bundle_differs() {
        let bundle = b"BUNDLE".as_slice();
        let entries = [
            WebhookEntry {
                name: "a.projection.sh",
                ca_bundle: Some(bundle),
            },
            WebhookEntry {
                name: "b.projection.sh",
                ca_bundle: None,
            },
            WebhookEntry {
                name: "c.projection.sh",
                ca_bundle: Some(b"OLD".as_slice()),
            },
        ];
        let patch = ca_bundle_patch(&entries, bundle).expect("two entries differ");
        assert_eq!(
            serde_json::to_value(&patch).expect("JSON"),
            serde_json::json!([
                {"op": "test", "path": "/webhooks/1/name", "value": "b.projection.sh"},
                {"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "QlVORExF"},
                {"op": "test", "path": "/webhooks/2/name", "value": "c.projection.sh"},
                {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": "QlVORExF"},
            ])
        );
        assert_eq!(ca_bundle_patch(&entries[..1], bundle), None);
        assert_eq!(ca_bundle_patch(&[], bundle), None);

        // Applied to a configuration, it changes nothing but the bundles.
        let mut config = serde_json::json!({"webhooks": [
            {"name": "a.projection.sh", "clientConfig": {"url": "https://x/a", "caBundle": "QlVORExF"}, "rules": []},
            {"name": "b.projection.sh", "clientConfig": {"url": "https://x/b"}, "sideEffects": "None"},
            {"name": "c.projection.sh", "clientConfig": {"service": {"name": "s"}, "caBundle": "T0xE"}},
        ]});
        json_patch::patch(&mut config, &patch).expect("applies");
        assert_eq!(
            config["webhooks"][1]["clientConfig"],
            serde_json::json!({"url": "https://x/b", "caBundle": "QlVORExF"})
        );
        assert_eq!(config["webhooks"][1]["sideEffects"], "None");
        assert_eq!(
            config["webhooks"][2]["clientConfig"]["service"],
            serde_json::json!({"name": "s"})
        );
        // A list reordered in between: the guard fails the whole patch.
        let mut reordered = serde_json::json!({"webhooks": [
            {"name": "x", "clientConfig": {}}, {"name": "c.projection.sh", "clientConfig": {}}, {"name": "b.projection.sh", "clientConfig": {}},
        ]});
        assert!(json_patch::patch(&mut reordered, &patch).is_err());
    }
}
