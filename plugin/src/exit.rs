//! Exit codes a script can rely on (docs/kubectl-plugin.md lists them).

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Done: the copy is current, every CR Ready, nothing to act on.
    Ok = 0,
    /// The cluster could not be read or written, or the input not read.
    Error = 1,
    /// The command line is wrong (clap's own code).
    Usage = 2,
    /// The object, CR or file named does not exist.
    NotFound = 3,
    /// Something needs a person: a stale copy, a conflict, a CR not Ready.
    Attention = 4,
    /// `why`: no CR owns the object.
    NotManaged = 5,
    /// `preview`: admission would refuse the manifest.
    Invalid = 6,
    /// `sync --wait`: the controller did not handle the request in time.
    TimedOut = 7,
}

/// Why a command stopped early.
#[derive(Debug)]
pub enum Failure {
    /// Reading or writing the cluster or the input failed.
    Error(anyhow::Error),
    /// What was named does not exist.
    NotFound(String),
    /// Admission would refuse this manifest, with its message.
    Invalid(String),
    /// Waited in vain.
    TimedOut(String),
    /// The command line names nothing usable.
    Usage(String),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Self::Error(e)
    }
}

impl Failure {
    /// The exit code and the line for stderr.
    pub fn report(&self) -> (Code, String) {
        match self {
            Self::Error(e) => (Code::Error, format!("error: {e:#}")),
            Self::NotFound(m) => (Code::NotFound, format!("error: {m}")),
            Self::Invalid(m) => (Code::Invalid, format!("error: {m}")),
            Self::TimedOut(m) => (Code::TimedOut, format!("error: {m}")),
            Self::Usage(m) => (Code::Usage, format!("error: {m}")),
        }
    }
}
