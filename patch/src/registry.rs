//! The runtime's one registry, shared by the trampolines and by attach
//! and detach.
//!
//! One registry serves every site (the kernel's fprobe shares ftrace the
//! same way): the trampolines need no table from site to registry, and a
//! probe layer frame never outlives its registry, which lives as long as
//! the process.

use std::sync::OnceLock;

use fprobe::probe::Registry;

use crate::regs::Regs;

/// The runtime's registry: every probe [`attach`](crate::attach) registers lives here.
/// Use it for [`Registry::stats`], [`Registry::enable`] and
/// [`Registry::disable`] on an [`Attached::handle`](crate::Attached::handle);
/// registering in it directly attaches nothing (no site is patched for such a probe).
///
/// # Examples
///
/// ```
/// assert_eq!(fprobe_patch::registry().addresses(), 0);
/// ```
pub fn registry() -> &'static Registry<Regs> {
    static REGISTRY: OnceLock<Registry<Regs>> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        Registry::builder()
            .max_probes(4096)
            .max_depth(256)
            .build()
            .expect("a valid configuration")
    })
}
