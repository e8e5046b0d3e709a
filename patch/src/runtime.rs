//! The process-wide runtime: the sites it knows, and attach/detach
//! through its one registry (`registry.rs`).
//!
//! Each known function records how many attached probes use it; its
//! entry is patched while that count is above zero.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use fprobe::probe::{Fprobe, ProbeHandle, ProbeStats};

use crate::error::Error;
use crate::layout::Layout;
use crate::registry::registry;
use crate::regs::Regs;
use crate::sites::{self, Module};
use crate::text::{self, ENTRY_JMP, ENTRY_NOPS, PREFIX_NOPS};
use crate::{clobber, stubs, tramp};

/// A probe attached by [`attach`]; give it to [`detach`].
#[derive(Debug)]
#[must_use = "a probe stays attached until it is detached"]
pub struct Attached {
    handle: ProbeHandle,
    functions: Vec<u64>,
    /// Per function, which loaded copy of it was patched (`Known::copy`):
    /// a library unloaded and loaded again at the same place is another.
    copies: Vec<u64>,
}

impl Attached {
    /// The probe's handle in [`registry`].
    pub fn handle(&self) -> ProbeHandle {
        self.handle
    }

    /// The functions it is attached to.
    pub fn functions(&self) -> &[u64] {
        &self.functions
    }

    /// The probe's counts ([`Registry::stats`](fprobe::probe::Registry::stats)).
    pub fn stats(&self) -> ProbeStats {
        registry()
            .stats(self.handle)
            .expect("attached probes stay registered until detached")
    }
}

struct Known {
    module: usize,
    site: u64,
    layout: Layout,
    /// Its stub and what the stub's trampolines save, once its module's
    /// stubs are made.
    stub: Option<(u64, RegisterSave)>,
    /// Attached probes using it.
    users: u32,
    /// Tells this loaded copy of the function from one of an object loaded
    /// at the same place after this one was unloaded.
    copy: u64,
}

impl Known {
    /// The jump its site's prefix holds while patched; `None` before its
    /// stub exists or out of rel32 reach of it.
    fn prefix_jmp(&self) -> Option<[u8; 5]> {
        text::jmp_rel32(self.site, self.stub?.0 + stubs::ENTRY_OFFSET)
    }

    /// Whether the code at `f`, in an object still loaded where this was
    /// found, is another copy of it: patched by us, yet showing its nops
    /// (the object was unloaded and loaded again at the same place).
    ///
    /// # Safety
    ///
    /// `f`'s object is loaded (its code mapped).
    unsafe fn reloaded(&self, f: u64) -> bool {
        // SAFETY: by the caller's contract.
        self.users > 0 && unsafe { read2(f) } != ENTRY_JMP
    }
}

#[derive(Default)]
struct State {
    modules: Vec<Module>,
    /// Per module: still loaded at the last scan.
    loaded: Vec<bool>,
    functions: HashMap<u64, Known>,
    /// Functions of unloaded objects that attached probes still count as
    /// used, by (address, copy): their detach has nothing to restore.
    orphans: HashMap<(u64, u64), Known>,
    /// The next `Known::copy`.
    copies: u64,
}

/// Per module, whether it is still loaded: the same path with its code at
/// the same place, from one `dl_iterate_phdr` walk (no file read).
#[derive(Default)]
struct ModulesPresent(Option<Vec<(String, (u64, u64))>>);

impl ModulesPresent {
    fn check(&mut self, st: &State, module: usize) -> bool {
        let now = self.0.get_or_insert_with(|| {
            sites::loaded()
                .into_iter()
                .map(|(path, _, _, code)| (path, code))
                .collect()
        });
        let m = &st.modules[module];
        // A module once found unloaded stays so: an object loaded again at
        // the same place is another module (`rescan`).
        st.loaded[module] && now.iter().any(|(p, c)| same_module(m, p, *c))
    }
}

/// Whether `m` is the object at `path` with its code at `code`.
fn same_module(m: &Module, path: &str, code: (u64, u64)) -> bool {
    *m.path == *path && m.code == code
}

/// The two bytes at `at`.
///
/// # Safety
///
/// `at .. at + 2` is mapped and readable.
unsafe fn read2(at: u64) -> [u8; 2] {
    // SAFETY: by the caller's contract; volatile, as the code may be
    // changing under other threads' feet.
    unsafe { std::ptr::read_volatile(at as *const [u8; 2]) }
}

impl State {
    /// Reads the loaded objects again, keeping what is known of objects
    /// still loaded at the same place (their stubs, their users). A
    /// function of an object unloaded (or unloaded and loaded again) since
    /// is forgotten, or kept as an orphan while attached probes count it.
    fn rescan(&mut self) -> Result<(), Error> {
        let now = sites::modules()?;
        // A module found unloaded once is never present again: its
        // functions were forgotten then, and an object loaded at the same
        // place since is a new module with its own.
        let present: Vec<bool> = self
            .modules
            .iter()
            .zip(&self.loaded)
            .map(|(k, &was)| was && now.iter().any(|(m, _)| same_module(k, &m.path, m.code)))
            .collect();
        // A present module is still the one known unless it was reloaded.
        self.loaded.clone_from(&present);
        for (&f, k) in &self.functions {
            // SAFETY: checked present: its code is mapped.
            if present[k.module] && unsafe { k.reloaded(f) } {
                self.loaded[k.module] = false;
            }
        }
        let gone: Vec<u64> = self
            .functions
            .iter()
            .filter(|(_, k)| !self.loaded[k.module])
            .map(|(&f, _)| f)
            .collect();
        for f in gone {
            let k = self.functions.remove(&f).expect("listed above");
            if k.users > 0 {
                self.orphans.insert((f, k.copy), k);
            }
        }
        for (m, sites) in now {
            let known = self
                .modules
                .iter()
                .zip(&self.loaded)
                .any(|(k, &l)| l && same_module(k, &m.path, m.code));
            if known {
                continue;
            }
            let i = self.modules.len();
            self.modules.push(m);
            self.loaded.push(true);
            for s in sites {
                if self.functions.contains_key(&s.function) {
                    continue; // a loaded object's, listed twice
                }
                self.copies += 1;
                let fresh = Known {
                    module: i,
                    site: s.site,
                    layout: s.layout,
                    stub: None,
                    users: 0,
                    copy: self.copies,
                };
                self.functions.insert(s.function, fresh);
            }
        }
        Ok(())
    }

    /// Makes the stubs of every function of module `m` that has none.
    fn stubs_for(&mut self, m: usize) -> Result<(), Error> {
        let mut fs: Vec<u64> = self
            .functions
            .iter()
            .filter(|(_, k)| k.module == m && k.stub.is_none())
            .map(|(&f, _)| f)
            .collect();
        if fs.is_empty() {
            return Ok(());
        }
        fs.sort_unstable();
        let module = &self.modules[m];
        // Which functions need only their argument and return registers
        // kept: decided once, from their code, before any can be patched.
        // Relaxed: a setting read under the state mutex; a store racing
        // with a first attach applies to it or to the next object.
        let policy = ARGUMENT_ONLY.load(Ordering::Relaxed);
        let lean = if policy == ArgumentOnlySaves::WhereFunctionsCallOut as u8 {
            clobber::clobbers_all(&module.text, module.code)
        } else {
            Default::default()
        };
        let everywhere = policy == ArgumentOnlySaves::Everywhere as u8;
        let with: Vec<(u64, bool)> = fs
            .iter()
            .map(|f| (*f, everywhere || lean.contains(f)))
            .collect();
        let made = stubs::make(&module.path, module.code, &with, tramp::trampolines())?;
        for ((f, lean), s) in with.into_iter().zip(made) {
            let save = if lean {
                RegisterSave::ArgumentsOnly
            } else {
                RegisterSave::All
            };
            self.functions.get_mut(&f).expect("listed above").stub = Some((s, save));
        }
        Ok(())
    }
}

/// What the trampolines of a patched function save around the probe
/// layer's entry and exit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegisterSave {
    /// Every caller-saved register: a caller may keep values in those the
    /// function leaves alone.
    All,
    /// The argument registers at entry and the return registers at exit
    /// ([`set_argument_only_saves`]): no caller keeps a value in a
    /// caller-saved register across a call to the function. The
    /// trampolines take 67 instructions per call instead of 127.
    ArgumentsOnly,
}

/// Which patched functions' trampolines save only the argument registers
/// at entry and the return registers at exit
/// ([`RegisterSave::ArgumentsOnly`]) instead of every caller-saved
/// register ([`set_argument_only_saves`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ArgumentOnlySaves {
    /// None (the default).
    Never = 0,
    /// Functions that make a call their compiler cannot see into (through
    /// the PLT or a pointer, themselves or through functions of their
    /// object they call), found by decoding the object's code: such a
    /// function clobbers every call-clobbered register as far as its
    /// callers know.
    WhereFunctionsCallOut = 1,
    /// Every function. For objects whose callers never keep values in
    /// caller-saved registers across calls to patchable functions: built
    /// by GCC with `-fpatchable-function-entry` on the command line (GCC
    /// then turns its interprocedural register allocation off, as for
    /// `-pg`), or by Clang (whose interprocedural register allocation is
    /// off unless asked for). Not for code whose patchable entries come
    /// from the `patchable_function_entry` attribute alone: GCC's callers
    /// may then keep values in registers the callee leaves alone.
    Everywhere = 2,
}

/// Which stubs made from now on save only argument and return registers
/// ([`set_argument_only_saves`]).
static ARGUMENT_ONLY: AtomicU8 = AtomicU8::new(ArgumentOnlySaves::Never as u8);

/// Chooses which functions' trampolines save only the argument registers
/// at entry and the return registers at exit, for objects whose stubs are
/// made afterwards (at the first attach to one of their functions; a stub
/// never changes). [`ArgumentOnlySaves::Never`] by default.
///
/// Either of the other policies is sound only for code of the SysV calling
/// convention compiled without `-pg` or `-mfentry` (GCC and Clang, any
/// optimisation, LTO included), and [`ArgumentOnlySaves::Everywhere`] only
/// under the conditions it names. Do not choose one for an object with
/// functions of another convention (`__attribute__((ms_abi))`, whose
/// callers expect `rsi rdi` and `xmm6`–`xmm15` kept; Clang's
/// `preserve_most`, `preserve_all`; `no_caller_saved_registers`), or whose
/// profiling calls the compiler does not count as calls: their callers
/// would get registers back changed. Nothing in a binary tells such code
/// apart.
///
/// # Examples
///
/// ```
/// use fprobe_patch::ArgumentOnlySaves;
///
/// fprobe_patch::set_argument_only_saves(ArgumentOnlySaves::WhereFunctionsCallOut);
/// ```
pub fn set_argument_only_saves(policy: ArgumentOnlySaves) {
    // Relaxed: see `stubs_for`.
    ARGUMENT_ONLY.store(policy as u8, Ordering::Relaxed);
}

/// What the trampolines of `function` save, once it has been attached
/// (its stub is made at its first attach and kept); `None` before.
///
/// # Examples
///
/// ```
/// assert_eq!(fprobe_patch::register_save(0x1000), None);
/// ```
pub fn register_save(function: u64) -> Option<RegisterSave> {
    let st = state().lock().unwrap_or_else(|p| p.into_inner());
    st.functions
        .get(&function)
        .and_then(|k| k.stub)
        .map(|(_, save)| save)
}

fn state() -> &'static Mutex<State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE.get_or_init(Default::default)
}

/// Attaches `probe` to `functions` (addresses of patchable functions, as
/// [`sites`](crate::sites) lists them): registers it in [`registry`] and
/// patches the entry of each function not already patched. All or
/// nothing: on an error no probe is registered and no site changed.
///
/// # Errors
///
/// [`Error::NotASite`], [`Error::UnsupportedLayout`],
/// [`Error::UnexpectedBytes`], [`Error::Straddles`] for a function that
/// cannot be patched; [`Error::Registry`] when the registry refuses the
/// probe; [`Error::OutOfReach`], [`Error::Os`] when the patching itself
/// fails (then everything done is undone).
///
/// # Examples
///
/// See the [crate docs](crate).
pub fn attach(probe: Fprobe<Regs>, functions: &[u64]) -> Result<Attached, Error> {
    attach_with_cookies(probe, functions.iter().map(|&f| (f, 0)))
}

/// [`attach`] with a cookie per function, which the handlers see as
/// `EntryContext::cookie` and `ExitContext::cookie` (an engine's index
/// of the function, say). A function given twice keeps its first cookie.
///
/// # Errors
///
/// As [`attach`].
///
/// # Examples
///
/// ```no_run
/// use fprobe::probe::Fprobe;
///
/// let sites = fprobe_patch::sites()?;
/// let probe = Fprobe::<fprobe_patch::Regs>::builder()
///     .exit(|x| println!("function {} returned {}", x.cookie, x.ctx.ret()))
///     .build();
/// let a = fprobe_patch::attach_with_cookies(
///     probe,
///     sites.iter().enumerate().map(|(i, s)| (s.function, i as u64)),
/// )?;
/// fprobe_patch::detach(a)?;
/// # Ok::<(), fprobe_patch::Error>(())
/// ```
pub fn attach_with_cookies(
    probe: Fprobe<Regs>,
    functions: impl IntoIterator<Item = (u64, u64)>,
) -> Result<Attached, Error> {
    let mut with_cookies: Vec<(u64, u64)> = functions.into_iter().collect();
    // Stable: the first cookie of a function given twice stays first.
    with_cookies.sort_by_key(|&(f, _)| f);
    with_cookies.dedup_by_key(|&mut (f, _)| f);
    let functions: Vec<u64> = with_cookies.iter().map(|&(f, _)| f).collect();
    let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
    ready(&mut st, &functions)?;
    let handle = registry().register_with_cookies(probe, with_cookies)?;
    let fresh: Vec<u64> = functions
        .iter()
        .copied()
        .filter(|f| st.functions[f].users == 0)
        .collect();
    if let Err(e) = patch(&st, &fresh, true) {
        registry()
            .unregister(handle)
            .expect("registered just above");
        return Err(e);
    }
    let mut copies = Vec::with_capacity(functions.len());
    for f in &functions {
        let k = st.functions.get_mut(f).expect("checked");
        k.users += 1;
        copies.push(k.copy);
    }
    Ok(Attached {
        handle,
        functions,
        copies,
    })
}

/// Makes `functions` ready to patch: rescans the loaded objects if one is
/// unknown or stale, checks every site, and makes the stubs of their
/// objects that have none yet.
fn ready(st: &mut State, functions: &[u64]) -> Result<(), Error> {
    // Whether each module is still loaded where it was: asked once, not
    // per function.
    let mut present = ModulesPresent::default();
    let stale = |st: &State, present: &mut ModulesPresent, f: u64| {
        st.functions.get(&f).is_none_or(|k| {
            // SAFETY: the module's code is mapped (checked just before).
            !present.check(st, k.module) || unsafe { k.reloaded(f) }
        })
    };
    if functions.iter().any(|&f| stale(st, &mut present, f)) {
        st.rescan()?;
        present = ModulesPresent::default();
    }
    // Check every function before changing anything.
    let mut modules = Vec::new();
    for &f in functions {
        let k = st.functions.get(&f).ok_or(Error::NotASite(f))?;
        if !present.check(st, k.module) {
            return Err(Error::NotASite(f));
        }
        if k.layout != Layout::HotPatch {
            return Err(Error::UnsupportedLayout {
                function: f,
                layout: k.layout,
            });
        }
        if f % 8 == 7 {
            return Err(Error::Straddles(f));
        }
        // SAFETY: a site of a loaded object: its seven bytes are mapped.
        let found = unsafe { text::read7(k.site) };
        let prefix_ok =
            found[..5] == PREFIX_NOPS || k.prefix_jmp().is_some_and(|j| found[..5] == j);
        let entry_ok = if k.users == 0 {
            found[5..] == ENTRY_NOPS
        } else {
            found[5..] == ENTRY_JMP
        };
        if !prefix_ok || !entry_ok {
            return Err(Error::UnexpectedBytes { function: f, found });
        }
        if !modules.contains(&k.module) {
            modules.push(k.module);
        }
    }
    for m in modules {
        st.stubs_for(m)?;
    }
    Ok(())
}

/// Does now what the first attach to `functions` would do besides
/// patching: reads the loaded objects (their sites, symbols and code),
/// checks every site, makes the stubs (and, per
/// [`set_argument_only_saves`], decodes the code) of their objects, and
/// registers the process for the serialising `membarrier(2)`. A later
/// [`attach`] to them only registers and patches. Optional; for an
/// engine that wants the attach itself quick (one that attaches when
/// asked, not at start).
///
/// # Errors
///
/// As [`attach`] for the functions' checks and the objects' reading.
///
/// # Examples
///
/// ```no_run
/// let sites = fprobe_patch::sites()?;
/// let functions: Vec<u64> = sites.iter().map(|s| s.function).collect();
/// fprobe_patch::prepare(&functions)?;
/// // ... later, quick:
/// # let probe = fprobe::probe::Fprobe::<fprobe_patch::Regs>::builder().exit(|_| {}).build();
/// let attached = fprobe_patch::attach(probe, &functions)?;
/// # Ok::<(), fprobe_patch::Error>(())
/// ```
pub fn prepare(functions: &[u64]) -> Result<(), Error> {
    let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
    ready(&mut st, functions)?;
    // The membarrier registration a first patch would make.
    text::sync_core_registered();
    Ok(())
}

/// Detaches a probe after draining it: stops its entries, waits up to
/// `timeout` for the calls in flight on other threads to return through
/// its exit handler ([`Registry::drain`](fprobe::probe::Registry::drain)), then [`detach`]es it. Returns
/// the calls that were still in flight at the timeout (their exits are
/// skipped): 0 when every call of the probe in flight on another thread
/// has returned.
///
/// # Errors
///
/// As [`detach`].
///
/// # Panics
///
/// From a handler (as [`Registry::drain`](fprobe::probe::Registry::drain)).
pub fn detach_draining(a: Attached, timeout: std::time::Duration) -> Result<u64, Error> {
    let left = registry()
        .drain(a.handle, timeout)
        .expect("attached probes stay registered until detached");
    detach(a)?;
    Ok(left)
}

/// Detaches a probe: unregisters it (when this returns none of its
/// handlers runs or will run; one grace period) and restores the entry
/// nops of every function no other attached probe uses. A thread inside
/// one of those functions finishes its call unprobed and returns to its
/// caller through its stub, which still knows where.
///
/// # Errors
///
/// [`Error::Os`] when a page's protections cannot be changed; the probe is
/// unregistered anyway and the entries stay patched (calling nothing).
pub fn detach(a: Attached) -> Result<(), Error> {
    registry()
        .unregister(a.handle)
        .expect("attached probes stay registered until detached");
    let mut st = state().lock().unwrap_or_else(|p| p.into_inner());
    let mut idle = Vec::new();
    for (&f, &copy) in a.functions.iter().zip(&a.copies) {
        match st.functions.get_mut(&f) {
            Some(k) if k.copy == copy => {
                k.users -= 1;
                if k.users == 0 {
                    idle.push(f);
                }
            }
            // Its object was unloaded since: nothing to restore.
            _ => {
                let key = (f, copy);
                let o = st
                    .orphans
                    .get_mut(&key)
                    .expect("attached functions are known");
                o.users -= 1;
                if o.users == 0 {
                    st.orphans.remove(&key);
                }
            }
        }
    }
    let r = patch(&st, &idle, false);
    if r.is_err() {
        for f in &idle {
            st.functions.get_mut(f).expect("known").users += 1;
        }
    }
    r
}

/// Patches (`on`) or restores the entries of `functions`, in the steps
/// of the crate docs, "Layout and patching".
fn patch(st: &State, functions: &[u64], on: bool) -> Result<(), Error> {
    // A detach after `dlclose` has nothing left to restore there (nor in
    // an object loaded at the same place since: only the runtime's own
    // jump is undone).
    let kept: Vec<u64>;
    let functions = if on {
        functions
    } else {
        let mut present = ModulesPresent::default();
        kept = functions
            .iter()
            .copied()
            .filter(|f| {
                present.check(st, st.functions[f].module)
                    // SAFETY: the module's code is mapped (checked just before).
                    && unsafe { read2(*f) } == ENTRY_JMP
            })
            .collect();
        &kept[..]
    };
    if functions.is_empty() {
        return Ok(());
    }
    let span = |f: u64, at: u64, len: u64| {
        let k = &st.functions[&f];
        let prot = st.modules[k.module]
            .prot_at(at)
            .unwrap_or(libc::PROT_READ | libc::PROT_EXEC);
        (at, len, prot)
    };
    if on {
        let prefixes: Vec<(u64, [u8; 5])> = functions
            .iter()
            .map(|&f| {
                let k = &st.functions[&f];
                k.stub.expect("stubs made before patching");
                let jmp = k.prefix_jmp().ok_or_else(|| Error::OutOfReach {
                    module: st.modules[k.module].path.to_string(),
                })?;
                Ok((k.site, jmp))
            })
            .collect::<Result<_, Error>>()?;
        let spans: Vec<_> = functions
            .iter()
            .zip(&prefixes)
            .map(|(&f, &(site, _))| span(f, site, 5))
            .collect();
        text::with_writable(&spans, || {
            for &(site, jmp) in &prefixes {
                // SAFETY: writable now; the prefix holds nops or this same
                // jump (checked by `attach`), and is not executed until the
                // entry jump below exists.
                unsafe {
                    if text::read7(site)[..5] != jmp {
                        text::store(site, &jmp);
                    }
                }
            }
        })?;
        text::sync_core();
    }
    let bytes = if on { ENTRY_JMP } else { ENTRY_NOPS };
    let spans: Vec<_> = functions.iter().map(|&f| span(f, f, 2)).collect();
    text::with_writable(&spans, || {
        for &f in functions {
            // SAFETY: writable now, within one 8-byte block (checked by
            // `attach`); the other threads fetch the old pair or this one.
            unsafe { text::store2(f, bytes) };
        }
    })?;
    text::sync_core();
    Ok(())
}
