//! What `kubectl projection` reports, decided without I/O: which API resource a kubectl name means
//! (`resource_name`), who owns an object and whether a copy is current (`copy_of`), the per-namespace
//! outcome of a `preview` (`preview`, from `pass::plan` and `copy::write_plan::decide`, the
//! controller's own decisions), the one-line status of a CR (`summary`) and the health of the
//! installation's API (`api_health`). The plugin only reads the cluster around them.

pub mod api_health;
pub mod copy_of;
pub mod preview;
pub mod resource_name;
pub mod summary;
