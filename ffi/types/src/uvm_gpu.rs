//! nvidia-uvm's ids of the GPUs, and their UUIDs. The shim backend names a GPU as nvidia-uvm
//! does, by the processor id its faults carry (1 + 8 x the GPU's registration index + its MIG
//! sub-index), not by CUDA's device index. That id is handed out when nvidia-uvm first registers
//! the GPU, which CUDA does for every GPU a process can see when it initializes, and is given back
//! when no process has it registered any more: on a GPU server it depends on which GPUs other
//! processes use, and on CUDA_VISIBLE_DEVICES (measured on 2 x H200, stock driver 580.159.04,
//! 2026-11-28, `device/tests/uvm_ids.cu`: with both GPUs visible they were ids 1 and 9; with only
//! the second visible, or it first, it was id 1). Only the UUID names a GPU for good.
//!
//! nvidia-uvm publishes the mapping in `/proc/driver/nvidia-uvm/gpus` (`init_procfs_dirs()` in
//! `uvm_gpu.c`, readable by every user), one symbolic link per registered GPU named by its id
//! and pointing to `<parent UUID>/<MIG sub-index>`, beside links named by the GPU instance's UUID
//! pointing to the same place:
//!
//! ```text
//! 1 -> GPU-f8b6392b-54c8-ef74-2dc3-c6ed7bde1ec5/0            (580 and later)
//! GI-f8b6392b-54c8-ef74-2dc3-c6ed7bde1ec5 -> GPU-f8b6392b-54c8-ef74-2dc3-c6ed7bde1ec5/0
//! 9 -> UVM-GPU-6871d114-5c34-a5ec-0b30-451b680ec522/0        (550: the instance's link only under MIG)
//! ```
//!
//! Without MIG the instance's UUID is the GPU's own. Under MIG, CUDA names a device by its MIG
//! UUID; that it is the instance UUID nvidia-uvm links is NVIDIA's documented intent but was not
//! seen here (the lent GPUs cannot be switched to MIG).

use std::fmt;
use std::io;
use std::path::Path;

/// Where nvidia-uvm lists its registered GPUs.
pub const PROCFS_GPUS: &str = "/proc/driver/nvidia-uvm/gpus";

/// A GPU's 16-byte UUID, as CUDA (`cudaDeviceProp::uuid`, `cuDeviceGetUuid`) and nvidia-uvm
/// hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// Parses a UUID, bare or after one of the prefixes NVIDIA's tools and nvidia-uvm write
    /// (`GPU-`, `MIG-`, `GI-`, `UVM-GPU-`): 32 hex digits in the groups 8-4-4-4-12.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let tail = ["UVM-GPU-", "GPU-", "MIG-", "GI-", ""].iter().find_map(|prefix| text.strip_prefix(prefix))?;
        if tail.len() != 36 || !tail.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return None;
        }
        let groups: Vec<&str> = tail.split('-').collect();
        if groups.iter().map(|g| g.len()).ne([8, 4, 4, 4, 12]) {
            return None;
        }
        let digits: String = groups.concat();
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(digits.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(bytes))
    }
}

impl fmt::Display for Uuid {
    /// The 8-4-4-4-12 form, without a prefix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// One GPU registered with nvidia-uvm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UvmGpu {
    /// nvidia-uvm's processor id.
    pub id: u32,
    /// The physical GPU's UUID.
    pub parent: Uuid,
    /// The MIG sub-index (0 without MIG).
    pub sub_index: u32,
    /// The GPU instance's UUIDs that name it (its own without MIG), where nvidia-uvm links them.
    pub instances: Vec<Uuid>,
}

/// Why a UUID does not name one registered GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupError {
    /// No registered GPU has it: no process has a CUDA context that sees the GPU, or it is not
    /// an NVIDIA GPU's UUID.
    NotRegistered(Uuid),
    /// It is the physical UUID of a GPU with several MIG instances registered: name the
    /// instance (its MIG UUID) instead.
    Ambiguous(Uuid, Vec<u32>),
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotRegistered(uuid) => write!(
                f,
                "no GPU {uuid} is registered with nvidia-uvm (a process sees a GPU there once it has initialized CUDA)"
            ),
            Self::Ambiguous(uuid, ids) => {
                write!(f, "GPU {uuid} has several MIG instances registered (ids {ids:?}): name one by its MIG UUID")
            }
        }
    }
}

/// The GPUs nvidia-uvm has registered now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UvmGpus(pub Vec<UvmGpu>);

impl UvmGpus {
    /// From the entries of the procfs directory: each name with the target of its link (`None`
    /// for a directory). Entries of another form are ignored.
    pub fn from_entries<'a>(entries: impl IntoIterator<Item = (&'a str, Option<&'a str>)>) -> Self {
        let mut gpus = Vec::new();
        let mut aliases = Vec::new();
        for (name, target) in entries {
            let Some((parent, sub_index)) = target.and_then(parse_target) else { continue };
            match name.parse::<u32>() {
                Ok(id) => gpus.push(UvmGpu { id, parent, sub_index, instances: Vec::new() }),
                Err(_) => {
                    if let Some(instance) = Uuid::parse(name) {
                        aliases.push((instance, parent, sub_index));
                    }
                }
            }
        }
        for gpu in &mut gpus {
            gpu.instances = aliases
                .iter()
                .filter(|(_, parent, sub)| *parent == gpu.parent && *sub == gpu.sub_index)
                .map(|(instance, _, _)| *instance)
                .collect();
        }
        gpus.sort_by_key(|gpu| gpu.id);
        Self(gpus)
    }

    /// Reads `dir` (normally [`PROCFS_GPUS`]).
    pub fn read(dir: &Path) -> io::Result<Self> {
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let target = std::fs::read_link(entry.path()).ok().map(|t| t.to_string_lossy().into_owned());
            entries.push((name, target));
        }
        Ok(Self::from_entries(entries.iter().map(|(name, target)| (name.as_str(), target.as_deref()))))
    }

    /// The id of the GPU `uuid` names: an instance's UUID (a MIG UUID, or without MIG the GPU's
    /// own), or the physical UUID of a GPU with one registered instance.
    pub fn id_of(&self, uuid: Uuid) -> Result<u32, LookupError> {
        if let Some(gpu) = self.0.iter().find(|gpu| gpu.instances.contains(&uuid)) {
            return Ok(gpu.id);
        }
        let ids: Vec<u32> = self.0.iter().filter(|gpu| gpu.parent == uuid).map(|gpu| gpu.id).collect();
        match ids[..] {
            [] => Err(LookupError::NotRegistered(uuid)),
            [id] => Ok(id),
            _ => Err(LookupError::Ambiguous(uuid, ids)),
        }
    }

    /// The GPU of id `id`, if one is registered.
    pub fn by_id(&self, id: u32) -> Option<&UvmGpu> {
        self.0.iter().find(|gpu| gpu.id == id)
    }
}

/// `<prefix><UUID>/<sub-index>`, a link's target.
fn parse_target(target: &str) -> Option<(Uuid, u32)> {
    let (uuid, sub) = target.rsplit_once('/')?;
    Some((Uuid::parse(uuid)?, sub.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "f8b6392b-54c8-ef74-2dc3-c6ed7bde1ec5";
    const B: &str = "6871d114-5c34-a5ec-0b30-451b680ec522";

    fn uuid(text: &str) -> Uuid {
        Uuid::parse(text).expect("a UUID")
    }

    #[test]
    fn uuids_parse_after_any_prefix_and_print_back() {
        for text in [A.to_string(), format!("GPU-{A}"), format!("MIG-{A}"), format!("UVM-GPU-{A}"), format!("GI-{A}")] {
            assert_eq!(uuid(&text).to_string(), A, "{text}");
        }
        assert_eq!(uuid(A).0[..4], [0xf8, 0xb6, 0x39, 0x2b]);
        let signed = format!("+{}", &A[1..]);
        let prefixed = format!("junkGPU-{A}");
        for bad in [
            "",
            "GPU-",
            "f8b6392b54c8ef742dc3c6ed7bde1ec5",
            &A.replace('-', "_"),
            &A.replace('f', "g"),
            &signed,
            &prefixed,
        ] {
            assert_eq!(Uuid::parse(bad), None, "{bad}");
        }
    }

    /// The form of the listing seen on 2 x H200 with the stock driver 580.159.04 (2026-11-28; the
    /// UUIDs are those of the first machine probed, the committed results are a second one's).
    #[test]
    fn the_listing_of_580_maps_both_uuids_to_their_ids() {
        let links = [
            ("1".to_string(), Some(format!("GPU-{A}/0"))),
            ("9".to_string(), Some(format!("GPU-{B}/0"))),
            (format!("GI-{B}"), Some(format!("GPU-{B}/0"))),
            (format!("GI-{A}"), Some(format!("GPU-{A}/0"))),
            (format!("GPU-{B}"), None),
            (format!("GPU-{A}"), None),
        ];
        let gpus = UvmGpus::from_entries(links.iter().map(|(n, t)| (n.as_str(), t.as_deref())));
        assert_eq!(gpus.id_of(uuid(A)), Ok(1));
        assert_eq!(gpus.id_of(uuid(B)), Ok(9));
        assert_eq!(gpus.by_id(9).map(|g| g.instances.clone()), Some(vec![uuid(B)]));
        let other = uuid("00000000-0000-0000-0000-000000000001");
        assert_eq!(gpus.id_of(other), Err(LookupError::NotRegistered(other)));
    }

    /// 550 names the links `UVM-GPU-…` and links an instance's UUID only under MIG; a MIG
    /// GPU's physical UUID names no single instance.
    #[test]
    fn the_listing_of_550_with_mig_maps_instances_and_refuses_the_parent() {
        let (gi0, gi1) = ("11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-aaaaaaaaaaaa");
        let links = [
            ("1".to_string(), Some(format!("UVM-GPU-{A}/0"))),
            ("2".to_string(), Some(format!("UVM-GPU-{A}/1"))),
            (format!("UVM-GPU-{gi0}"), Some(format!("UVM-GPU-{A}/0"))),
            (format!("UVM-GPU-{gi1}"), Some(format!("UVM-GPU-{A}/1"))),
            ("9".to_string(), Some(format!("UVM-GPU-{B}/0"))),
            ("cpu".to_string(), None),
        ];
        let gpus = UvmGpus::from_entries(links.iter().map(|(n, t)| (n.as_str(), t.as_deref())));
        assert_eq!(gpus.id_of(uuid(gi0)), Ok(1));
        assert_eq!(gpus.id_of(uuid(gi1)), Ok(2));
        assert_eq!(gpus.id_of(uuid(B)), Ok(9), "without MIG the physical UUID names the GPU");
        assert_eq!(gpus.id_of(uuid(A)), Err(LookupError::Ambiguous(uuid(A), vec![1, 2])));
    }

    #[test]
    fn the_directory_is_read_as_nvidia_uvm_lays_it_out() {
        let dir = std::env::temp_dir().join(format!("wic-uvm-gpus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(format!("GPU-{B}/0"))).unwrap();
        std::os::unix::fs::symlink(format!("GPU-{B}/0"), dir.join("1")).unwrap();
        std::os::unix::fs::symlink(format!("GPU-{B}/0"), dir.join(format!("GI-{B}"))).unwrap();
        let gpus = UvmGpus::read(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(gpus.unwrap().id_of(uuid(B)), Ok(1));
        assert!(UvmGpus::read(Path::new("/nonexistent/nvidia-uvm/gpus")).is_err());
    }
}
