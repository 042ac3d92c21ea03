//! What is wrong with a configuration, naming the setting.

use std::path::PathBuf;

use fenced::node::InvalidNodeId;

use super::limits;

/// A configuration that cannot be used; each says which setting and what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config file is not TOML.
    #[error("invalid config {}: line {line}: {message}", path.display())]
    Syntax {
        path: PathBuf,
        line: usize,
        /// The parser's one-line message (its `Display` is a multi-line snippet).
        message: String,
    },
    /// A key of the config file is unknown or its value has the wrong type.
    #[error("invalid config {}: key `{key}`: {message}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        /// The parser's one-line message (its `Display` is a multi-line snippet).
        message: String,
    },
    /// An environment variable of an older release that would now be ignored.
    #[error("{old} was renamed {new}: set {new} instead (the old name would be ignored)")]
    Renamed {
        old: &'static str,
        new: &'static str,
    },
    /// `run` without a node id.
    #[error("missing --node-id (or FENCED_NODE_ID, or node_id in the config)")]
    MissingNodeId,
    /// The node id is not valid.
    #[error(transparent)]
    NodeId(#[from] InvalidNodeId),
    /// `--fencer nvme` without a device.
    #[error("--fencer nvme needs --block-device (or use --fencer none for single-signal fencing)")]
    NvmeWithoutDevice,
    /// `--fencer ebs` without a volume.
    #[error("--fencer ebs needs --ebs-volume-id")]
    EbsWithoutVolume,
    /// A volume with single-signal fencing.
    #[error("--ebs-volume-id given with --fencer none (single-signal): drop one of them")]
    EbsWithNone,
    /// A controller-only daemon with the NVMe fencer.
    #[error(
        "--role controller cannot use --fencer nvme: the NVMe fencer preempts with this host's own registration, which only the agent makes; use --role both on hosts with the shared namespace (or --fencer ebs/none)"
    )]
    NvmeControllerWithoutAgent,
    /// EBS settings in a build without the fencer.
    #[error("this fenced was built without the EBS fencer: rebuild with `--features ebs`")]
    EbsNotBuilt,
    /// `--on-fence` is not `exit`, `reboot` or `exec:COMMAND`.
    #[error(transparent)]
    OnFence(#[from] fenced::agent::on_fence::InvalidOnFence),
    /// The config path is not a regular file (a FIFO would block, `/dev/zero` never
    /// ends).
    #[error("cannot read config {}: it is a {kind}, not a regular file; point --config at a TOML file", path.display())]
    NotAFile { path: PathBuf, kind: &'static str },
    /// The config file is larger than [`limits::MAX_CONFIG_BYTES`].
    #[error(
        "cannot read config {}: larger than {} bytes (a config file has a few dozen lines); point --config at the right file",
        path.display(), limits::MAX_CONFIG_BYTES
    )]
    TooLarge { path: PathBuf },
    /// A number outside its range.
    #[error("{setting} = {value}: must be {min}..={max}: {why}")]
    OutOfRange {
        setting: &'static str,
        value: u64,
        min: u64,
        max: u64,
        why: &'static str,
    },
    /// A string that breaks its rule.
    #[error("{setting} = {value:?}: {rule}")]
    BadValue {
        setting: &'static str,
        value: String,
        rule: &'static str,
    },
    /// The instance id is not valid.
    #[error("--instance-id: {0}")]
    InstanceId(#[from] fenced::instance::InvalidInstanceId),
}
