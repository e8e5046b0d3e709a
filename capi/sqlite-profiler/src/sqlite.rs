//! The SQLite API, loaded with `dlopen` from one of the three shared
//! objects `build.rs` makes, and the multi-threaded SQL workload.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::Write;

type Db = *mut c_void;
type Stmt = *mut c_void;
type FnOpen = unsafe extern "C" fn(*const c_char, *mut Db) -> c_int;
type FnClose = unsafe extern "C" fn(Db) -> c_int;
type FnExec =
    unsafe extern "C" fn(Db, *const c_char, *const c_void, *mut c_void, *mut *mut c_char) -> c_int;
type FnPrepare =
    unsafe extern "C" fn(Db, *const c_char, c_int, *mut Stmt, *mut *const c_char) -> c_int;
type FnStep = unsafe extern "C" fn(Stmt) -> c_int;
type FnReset = unsafe extern "C" fn(Stmt) -> c_int;
type FnFinalize = unsafe extern "C" fn(Stmt) -> c_int;
type FnBindInt64 = unsafe extern "C" fn(Stmt, c_int, i64) -> c_int;
type FnBindText = unsafe extern "C" fn(Stmt, c_int, *const c_char, c_int, isize) -> c_int;
type FnColumnInt64 = unsafe extern "C" fn(Stmt, c_int) -> i64;
type FnErrmsg = unsafe extern "C" fn(Db) -> *const c_char;

/// One loaded copy of SQLite.
pub struct Lib {
    /// Path of the shared object.
    pub path: String,
    /// `dlopen` handle.
    pub handle: *mut c_void,
    open: FnOpen,
    close: FnClose,
    exec: unsafe extern "C" fn(
        Db,
        *const c_char,
        *const c_void,
        *mut c_void,
        *mut *mut c_char,
    ) -> c_int,
    prepare: FnPrepare,
    step: FnStep,
    reset: FnReset,
    finalize: FnFinalize,
    bind_int64: FnBindInt64,
    // The last argument is `sqlite3_destructor_type`; -1 is SQLITE_TRANSIENT.
    bind_text: FnBindText,
    column_int64: FnColumnInt64,
    errmsg: FnErrmsg,
}

// SAFETY: SQLite is built with SQLITE_THREADSAFE=1 and each thread uses its
// own connection; the struct holds only function pointers and the handle.
unsafe impl Send for Lib {}
// SAFETY: as above.
unsafe impl Sync for Lib {}

const SQLITE_ROW: c_int = 100;
const SQLITE_DONE: c_int = 101;

impl Lib {
    /// Loads `path` with `RTLD_NOW | RTLD_LOCAL`.
    pub fn load(path: &str) -> Lib {
        let c = CString::new(path).unwrap();
        // SAFETY: a valid C string; the library's constructors are SQLite's.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a C string after a failed dlopen.
            let e = unsafe { CStr::from_ptr(libc::dlerror()) };
            panic!("dlopen {path}: {}", e.to_string_lossy());
        }
        macro_rules! sym {
            ($name:literal, $ty:ty) => {{
                let p = Self::raw_sym(handle, $name);
                // SAFETY: the SQLite function of that name, whose C
                // signature the field's type declares.
                unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
            }};
        }
        Lib {
            path: path.to_string(),
            handle,
            open: sym!("sqlite3_open", FnOpen),
            close: sym!("sqlite3_close", FnClose),
            exec: sym!("sqlite3_exec", FnExec),
            prepare: sym!("sqlite3_prepare_v2", FnPrepare),
            step: sym!("sqlite3_step", FnStep),
            reset: sym!("sqlite3_reset", FnReset),
            finalize: sym!("sqlite3_finalize", FnFinalize),
            bind_int64: sym!("sqlite3_bind_int64", FnBindInt64),
            bind_text: sym!("sqlite3_bind_text", FnBindText),
            column_int64: sym!("sqlite3_column_int64", FnColumnInt64),
            errmsg: sym!("sqlite3_errmsg", FnErrmsg),
        }
    }

    fn raw_sym(handle: *mut c_void, name: &str) -> *mut c_void {
        let c = CString::new(name).unwrap();
        // SAFETY: a live handle and a C string.
        let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
        assert!(!p.is_null(), "{name} not found");
        p
    }

    /// Address of an exported symbol.
    pub fn sym(&self, name: &str) -> u64 {
        Self::raw_sym(self.handle, name) as u64
    }
}

struct Conn<'a> {
    lib: &'a Lib,
    db: Db,
}

impl Conn<'_> {
    fn check(&self, rc: c_int, what: &str) {
        if rc != 0 && rc != SQLITE_ROW && rc != SQLITE_DONE {
            // SAFETY: a live connection; errmsg returns a C string.
            let m = unsafe { CStr::from_ptr((self.lib.errmsg)(self.db)) };
            panic!("{what}: {rc} {}", m.to_string_lossy());
        }
    }

    fn exec(&self, sql: &str) {
        let c = CString::new(sql).unwrap();
        // SAFETY: a live connection and a C string; no callback.
        let rc = unsafe {
            (self.lib.exec)(
                self.db,
                c.as_ptr(),
                std::ptr::null(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        self.check(rc, sql);
    }

    fn prepare(&self, sql: &str) -> Stmt {
        let c = CString::new(sql).unwrap();
        let mut st = std::ptr::null_mut();
        // SAFETY: a live connection, a C string and an out pointer.
        let rc =
            unsafe { (self.lib.prepare)(self.db, c.as_ptr(), -1, &mut st, std::ptr::null_mut()) };
        self.check(rc, sql);
        st
    }

    /// Binds `(k, text)` to `st`'s two parameters and runs it.
    fn insert(&self, st: Stmt, k: i64, text: &[u8]) {
        // SAFETY: a prepared statement of this connection; SQLITE_TRANSIENT
        // (-1) makes SQLite copy the text.
        unsafe {
            self.check((self.lib.bind_int64)(st, 1, k), "bind");
            let n = text.len() as c_int;
            self.check(
                (self.lib.bind_text)(st, 2, text.as_ptr().cast(), n, -1),
                "bind",
            );
        }
        self.run(st, 0);
    }

    /// Steps to completion; returns the sum of column 0 (and 1) of each row.
    fn run(&self, st: Stmt, cols: c_int) -> i64 {
        let mut sum = 0i64;
        loop {
            // SAFETY: a prepared statement of this connection.
            let rc = unsafe { (self.lib.step)(st) };
            if rc == SQLITE_ROW {
                for c in 0..cols {
                    // SAFETY: as above; `c` is a result column.
                    sum = sum.wrapping_add(unsafe { (self.lib.column_int64)(st, c) });
                }
            } else {
                self.check(rc, "step");
                break;
            }
        }
        // SAFETY: as above.
        self.check(unsafe { (self.lib.reset)(st) }, "reset");
        sum
    }
}

/// One thread's work on its own in-memory database: bulk insert in a
/// transaction, an index build, range aggregates, a join with GROUP BY,
/// an UPDATE with string functions, and a LIKE scan. Returns a checksum
/// that must not depend on the copy of SQLite used.
pub fn workload(lib: &Lib, seed: u64, rows: i64) -> i64 {
    let mut db = std::ptr::null_mut();
    // SAFETY: a C string and an out pointer.
    let rc = unsafe { (lib.open)(c":memory:".as_ptr(), &mut db) };
    let c = Conn { lib, db };
    c.check(rc, "open");
    c.exec("CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER NOT NULL, v TEXT NOT NULL)");
    c.exec("CREATE TABLE g(k INTEGER PRIMARY KEY, name TEXT NOT NULL)");
    c.exec("BEGIN");
    let ins = c.prepare("INSERT INTO t(k, v) VALUES(?1, ?2)");
    let mut x = seed | 1;
    let mut buf = Vec::with_capacity(64);
    for i in 0..rows {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = (x % 1000) as i64;
        buf.clear();
        write!(buf, "row-{i}-{k}-{}", x % 97).unwrap();
        c.insert(ins, k, &buf);
    }
    let insg = c.prepare("INSERT INTO g(k, name) VALUES(?1, ?2)");
    for k in 0..1000i64 {
        buf.clear();
        write!(buf, "group-{}", k % 37).unwrap();
        c.insert(insg, k, &buf);
    }
    c.exec("COMMIT");
    c.exec("CREATE INDEX t_k ON t(k)");
    let mut sum = 0i64;
    let range = c.prepare("SELECT count(*), sum(length(v)) FROM t WHERE k BETWEEN ?1 AND ?2");
    for q in 0..200i64 {
        let lo = (q * 37) % 1000;
        // SAFETY: as above.
        unsafe {
            c.check((lib.bind_int64)(range, 1, lo), "bind");
            c.check((lib.bind_int64)(range, 2, lo + 25), "bind");
        }
        sum = sum.wrapping_add(c.run(range, 2));
    }
    let join = c.prepare(
        "SELECT count(*), sum(t.id) FROM t JOIN g ON t.k = g.k \
         WHERE g.k % 7 = ?1 GROUP BY g.name ORDER BY 1 DESC LIMIT 5",
    );
    for m in 0..7 {
        // SAFETY: as above.
        unsafe { c.check((lib.bind_int64)(join, 1, m), "bind") };
        sum = sum.wrapping_add(c.run(join, 2));
    }
    c.exec("UPDATE t SET v = upper(v) WHERE k % 10 = 3");
    let like = c.prepare("SELECT count(*), sum(id) FROM t WHERE v LIKE 'ROW-%'");
    sum = sum.wrapping_add(c.run(like, 2));
    for st in [ins, insg, range, join, like] {
        // SAFETY: statements of this connection, finalised once.
        c.check(unsafe { (lib.finalize)(st) }, "finalize");
    }
    // SAFETY: every statement is finalised.
    c.check(unsafe { (lib.close)(db) }, "close");
    sum
}
