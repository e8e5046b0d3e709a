//! Finding patchable functions: each loaded object's
//! `__patchable_function_entries` section, read in memory (its entries are
//! relocated at load), and its symbol tables for names and layouts.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

use crate::clobber::Code;
use crate::error::Error;
use crate::layout::Layout;

/// A patchable function of a loaded object.
#[derive(Clone, Debug)]
pub struct Site {
    /// The function's address (its symbol), where a probe is attached.
    pub function: u64,
    /// The address of the first nop (the section's entry).
    pub site: u64,
    /// The function's symbol, when the object has one.
    pub name: Option<Arc<str>>,
    /// The object's path (`/proc/self/exe` for the executable).
    pub module: Arc<str>,
    /// The nops' layout.
    pub layout: Layout,
}

/// A loaded object: where it is and what protections its code has.
#[derive(Clone, Debug)]
pub(crate) struct Module {
    pub(crate) path: Arc<str>,
    /// Lowest and highest address of its executable segments.
    pub(crate) code: (u64, u64),
    /// Its `PT_LOAD` segments: start, end, `PROT_*` flags.
    pub(crate) segments: Vec<(u64, u64, i32)>,
    /// Its functions and PLT sections, for the trampolines' register save
    /// (`clobber.rs`).
    pub(crate) text: Arc<Code>,
}

impl Module {
    /// The protections of the segment holding `addr`.
    pub(crate) fn prot_at(&self, addr: u64) -> Option<i32> {
        self.segments
            .iter()
            .find(|&&(s, e, _)| (s..e).contains(&addr))
            .map(|&(_, _, p)| p)
    }
}

/// Every patchable function of every object loaded now, in address order.
///
/// # Errors
///
/// [`Error::Object`] when an object's entry section does not lie in its
/// loaded segments. An object whose file cannot be read, or no longer
/// matches what is loaded, is skipped (its symbols are needed to place the
/// sites).
///
/// # Examples
///
/// ```
/// for s in fprobe_patch::sites()? {
///     println!("{:#x} {:?} in {}", s.function, s.name, s.module);
/// }
/// # Ok::<(), fprobe_patch::Error>(())
/// ```
pub fn sites() -> Result<Vec<Site>, Error> {
    let mut out: Vec<Site> = modules()?.into_iter().flat_map(|(_, s)| s).collect();
    out.sort_by_key(|s| s.function);
    Ok(out)
}

/// What `dl_iterate_phdr` says of one object: its name, load bias and
/// `PT_LOAD` segments (file addresses, `PROT_*` flags).
type Loaded = (String, u64, Vec<(u64, u64, i32)>);

/// The loaded objects with their segments (from `dl_iterate_phdr`), each
/// with its sites (from its file, read once).
pub(crate) fn modules() -> Result<Vec<(Module, Vec<Site>)>, Error> {
    let mut out = Vec::new();
    for (path, bias, segments, code) in loaded() {
        // The vDSO and objects whose file is gone have nothing to read.
        let Ok(data) = std::fs::read(&path) else {
            continue;
        };
        let Ok(file) = object::File::parse(&*data) else {
            continue;
        };
        // The file must be the one loaded (not replaced on disk since):
        // its PT_LOAD segments are the loaded ones.
        let same = file.segments().all(|seg| {
            let (a, len) = (seg.address() + bias, seg.size());
            segments.iter().any(|&(s, e, _)| s == a && e - s == len)
        });
        if !same {
            continue;
        }
        // Only an object with patchable functions gets stubs, which is
        // what the functions' extents are for.
        let text = if file.section_by_name(ENTRIES).is_some() {
            text_of(&file, bias)
        } else {
            Code::default()
        };
        let m = Module {
            path: path.into(),
            code,
            segments,
            text: Arc::new(text),
        };
        let sites = module_sites(&m, &file, bias)?;
        out.push((m, sites));
    }
    Ok(out)
}

/// One loaded object: path, load bias, segments `(start, end, PROT_*)`,
/// code span.
pub(crate) type LoadedNow = (String, u64, Vec<(u64, u64, i32)>, (u64, u64));

/// The objects loaded now with code, from `dl_iterate_phdr` alone (no
/// file read): path, load bias, `PT_LOAD` segments at their addresses,
/// and the span of the executable ones.
pub(crate) fn loaded() -> Vec<LoadedNow> {
    let mut raw: Vec<Loaded> = Vec::new();
    // SAFETY: the callback only reads the `dl_phdr_info` it is given
    // (valid during the call, by dl_iterate_phdr's contract) and pushes
    // into the Vec passed as `data`, which outlives the call.
    unsafe {
        libc::dl_iterate_phdr(Some(collect), (&raw mut raw).cast());
    }
    let mut out = Vec::new();
    for (name, bias, phdrs) in raw {
        let path = if name.is_empty() {
            "/proc/self/exe".to_string()
        } else {
            name
        };
        let segments: Vec<(u64, u64, i32)> = phdrs
            .iter()
            .map(|&(s, e, p)| (s + bias, e + bias, p))
            .collect();
        let code = segments
            .iter()
            .filter(|&&(_, _, p)| p & libc::PROT_EXEC != 0)
            .fold((u64::MAX, 0), |(lo, hi), &(s, e, _)| (lo.min(s), hi.max(e)));
        if code.0 < code.1 {
            out.push((path, bias, segments, code));
        }
    }
    out
}

/// `dl_iterate_phdr` callback: records one object's name, load bias and
/// `PT_LOAD` segments.
unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: `data` is the `&mut Vec` `modules` passed; `info` is valid
    // for the call (dl_iterate_phdr's contract).
    let (raw, info) = unsafe { (&mut *data.cast::<Vec<Loaded>>(), &*info) };
    let name = if info.dlpi_name.is_null() {
        String::new()
    } else {
        // SAFETY: a NUL-terminated string owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }
            .to_string_lossy()
            .into_owned()
    };
    let mut phdrs = Vec::new();
    for i in 0..usize::from(info.dlpi_phnum) {
        // SAFETY: `dlpi_phdr` points at `dlpi_phnum` program headers.
        let ph = unsafe { &*info.dlpi_phdr.add(i) };
        if ph.p_type != libc::PT_LOAD {
            continue;
        }
        let mut prot = 0;
        if ph.p_flags & libc::PF_R != 0 {
            prot |= libc::PROT_READ;
        }
        if ph.p_flags & libc::PF_W != 0 {
            prot |= libc::PROT_WRITE;
        }
        if ph.p_flags & libc::PF_X != 0 {
            prot |= libc::PROT_EXEC;
        }
        phdrs.push((ph.p_vaddr, ph.p_vaddr + ph.p_memsz, prot));
    }
    raw.push((name, info.dlpi_addr, phdrs));
    0
}

/// The section listing an object's patchable entries.
const ENTRIES: &str = "__patchable_function_entries";

/// The functions (sized text symbols) and PLT sections of `file`, at
/// their loaded addresses.
fn text_of(file: &object::File<'_>, bias: u64) -> Code {
    let mut code = Code::default();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() == SymbolKind::Text && sym.address() != 0 && sym.size() > 0 {
            // Aliases of one address: the shortest extent (a scan that
            // reads less can only mark less).
            let size = code
                .functions
                .entry(sym.address() + bias)
                .or_insert(u64::MAX);
            *size = (*size).min(sym.size());
        }
    }
    for section in file.sections() {
        if matches!(section.name(), Ok(".plt" | ".plt.sec" | ".plt.got")) {
            let start = section.address() + bias;
            code.plt.push((start, start + section.size()));
        }
    }
    code
}

/// The sites of module `m`, loaded with `bias`, from its parsed `file`.
fn module_sites(m: &Module, file: &object::File<'_>, bias: u64) -> Result<Vec<Site>, Error> {
    let Some(section) = file.section_by_name(ENTRIES) else {
        return Ok(Vec::new());
    };
    let (at, size) = (section.address() + bias, section.size());
    let object_err = |why: String| Error::Object {
        path: m.path.to_string(),
        why,
    };
    if !m
        .segments
        .iter()
        .any(|&(s, e, _)| s <= at && at.saturating_add(size) <= e)
    {
        return Err(object_err(
            "entry section outside the loaded segments".into(),
        ));
    }
    // Per address the best name: a global symbol over a local one, a
    // plain name over a compiler's alias (`f.localalias`, `f.cold`).
    let mut funcs: BTreeMap<u64, (u8, Arc<str>)> = BTreeMap::new();
    for sym in file.symbols().chain(file.dynamic_symbols()) {
        if sym.kind() != SymbolKind::Text || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let rank = u8::from(!sym.is_global()) + 2 * u8::from(name.contains('.'));
        let e = funcs
            .entry(sym.address() + bias)
            .or_insert_with(|| (rank, name.into()));
        if rank < e.0 {
            *e = (rank, name.into());
        }
    }
    let mut out = Vec::new();
    let n = (size / 8) as usize;
    for i in 0..n {
        // SAFETY: the section is mapped (it is SHF_ALLOC, inside a PT_LOAD
        // segment of a loaded object) and holds `size / 8` words.
        let site = unsafe { ((at as *const u64).add(i)).read_unaligned() };
        if site < m.code.0 || site + 7 > m.code.1 {
            continue; // not relocated into this object's code: skip it
        }
        // The function: a symbol reached from the site over nops only (or
        // over this runtime's prefix jump), no further than a site's nops
        // can reach. A site whose function has no symbol (a static
        // function of a stripped object) is not given the next one.
        let code_end = m.code.1;
        let byte = |a: u64| -> u8 {
            if a >= code_end {
                return 0;
            }
            // SAFETY: inside the object's executable segments (checked
            // against `code`); volatile, as a patch may be storing there.
            unsafe { std::ptr::read_volatile(a as *const u8) }
        };
        let candidate = funcs.range(site..=site + 16).next().filter(|&(&f, _)| {
            let ours = f == site + 5 && byte(site) == 0xe9;
            ours || (site..f).all(|a| byte(a) == 0x90)
        });
        let (function, name, layout) = match candidate {
            Some((&f, (_, name))) => {
                let before = (f - site) as u8;
                let at = (0..8).take_while(|&k| byte(f + k) == 0x90).count() as u8;
                let ours = [byte(f), byte(f + 1)] == crate::text::ENTRY_JMP;
                let layout = if before == 5 && (at >= 2 || ours) {
                    Layout::HotPatch
                } else {
                    Layout::Other { before, at }
                };
                (f, Some(name.clone()), layout)
            }
            None => (site, None, Layout::Unknown),
        };
        out.push(Site {
            function,
            site,
            name,
            module: m.path.clone(),
            layout,
        });
    }
    // One site per function, the patchable one first.
    out.sort_by_key(|s| (s.function, s.layout != Layout::HotPatch));
    out.dedup_by_key(|s| s.function);
    Ok(out)
}
