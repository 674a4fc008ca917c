//! The C ABI NCCL loads: `ncclEnvPlugin_v2` and `ncclEnvPlugin_v1`.
//!
//! The crate's only `unsafe` code. Layouts and signatures follow NVIDIA/nccl's published
//! headers: `src/include/plugin/env/env_v2.h` and `env_v1.h` (the same structs as
//! `plugins/env/example/nccl/env_v2.h`, `env_v1.h`), the logger type `ncclDebugLogger_t` and
//! the `ncclDebugLogLevel`/`ncclDebugLogSubSys` values of `plugins/env/example/nccl/common.h`,
//! and `ncclResult_t` values of `src/nccl.h.in` (the example's `err.h` numbers them
//! differently; `nccl.h` is what NCCL returns and checks, and the 2.32.3 wheel's `nccl.h` agrees).
//!
//! How NCCL drives it (`src/plugin/env.cc`, `src/plugin/env/env_v1.cc`, `env_v2.cc`,
//! `src/init.cc`, `src/misc/param.cc`): once per process, on the first variable NCCL
//! reads or its first API call, it dlopens the library, takes `ncclEnvPlugin_v2` (else
//! `_v1`, which it wraps), calls `init`, and from then on asks `getEnv` for every variable.
//! A non-success `init` is *not* a fallback to NCCL's internal plugin, whatever
//! `plugins/env/README.md` says: `ncclEnvPluginInit` returns it, `ncclInitEnv` keeps it, and
//! every API call that begins with `ncclInitEnv` (`ncclGetUniqueId`, `ncclCommInitRank`, …)
//! fails with it; `getEnv` keeps being called. This is how `onUnhealthy: Fail` stops a job.
//!
//! Rules kept here:
//! - no panic crosses the boundary (`catch_unwind` around every entry point); a panic in
//!   `init` leaves nothing cached and every answer pass-through;
//! - answers are computed once in `init` and never freed: the README asks a returned
//!   pointer to stay valid until `finalize` or the next `getEnv` of that name, and NCCL keeps
//!   some (`NCCL_SOCKET_IFNAME`, `NCCL_IB_HCA`) for the process' lifetime;
//! - a variable the plugin does not answer is libc's `getenv`, the same pointer NCCL's
//!   internal plugin (`src/plugin/env/default_env.cc`) returns;
//! - messages go to NCCL's logger with a `"%s"` format (the text is never a format string).
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_ulong, CStr, CString};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use railguard_nccl_env::{answers_for_process, route, Route};
use railguard_nccl_env::{Answers, Level};

/// `ncclResult_t` (`nccl.h`).
type NcclResult = c_int;
const NCCL_SUCCESS: NcclResult = 0;
/// `ncclSystemError`: "unhandled system error", what an unusable fabric is to the caller.
const NCCL_SYSTEM_ERROR: NcclResult = 2;

/// `ncclDebugLogLevel` values.
const NCCL_LOG_WARN: c_int = 2;
const NCCL_LOG_INFO: c_int = 3;
/// `ncclDebugLogSubSys` bits: info under INIT|ENV (both in NCCL's default
/// `NCCL_DEBUG_SUBSYS`), warnings under ALL so no subsystem mask hides them.
const NCCL_INIT: c_ulong = 1;
const NCCL_ENV: c_ulong = 128;
const NCCL_ALL: c_ulong = !0;

/// `ncclDebugLogger_t`: `void (*)(ncclDebugLogLevel, unsigned long, const char* file, int
/// line, const char* fmt, ...)`.
type NcclDebugLogger =
    unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// `ncclEnv_v2_t`.
#[repr(C)]
pub struct NcclEnvV2 {
    name: *const c_char,
    init: unsafe extern "C" fn(u8, u8, u8, *const c_char, Option<NcclDebugLogger>) -> NcclResult,
    finalize: unsafe extern "C" fn() -> NcclResult,
    get_env: unsafe extern "C" fn(*const c_char) -> *const c_char,
}

/// `ncclEnv_v1_t`: v2 without the logger.
#[repr(C)]
pub struct NcclEnvV1 {
    name: *const c_char,
    init: unsafe extern "C" fn(u8, u8, u8, *const c_char) -> NcclResult,
    finalize: unsafe extern "C" fn() -> NcclResult,
    get_env: unsafe extern "C" fn(*const c_char) -> *const c_char,
}

// SAFETY: both are immutable tables of a static string and function pointers.
unsafe impl Sync for NcclEnvV2 {}
// SAFETY: as above.
unsafe impl Sync for NcclEnvV1 {}

/// NCCL prints it ("ENV/Plugin: Using railguard (v2)").
const PLUGIN_NAME: &CStr = c"railguard";

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclEnvPlugin_v2: NcclEnvV2 = NcclEnvV2 {
    name: PLUGIN_NAME.as_ptr(),
    init: init_v2,
    finalize,
    get_env,
};

#[no_mangle]
#[allow(non_upper_case_globals)]
pub static ncclEnvPlugin_v1: NcclEnvV1 = NcclEnvV1 {
    name: PLUGIN_NAME.as_ptr(),
    init: init_v1,
    finalize,
    get_env,
};

extern "C" {
    /// libc's, as NCCL's internal plugin answers.
    fn getenv(name: *const c_char) -> *const c_char;
}

/// What `init` decided, for the process' lifetime.
struct Cache {
    values: BTreeMap<String, CString>,
    result: NcclResult,
}

static CACHE: OnceLock<Cache> = OnceLock::new();

extern "C" fn init_v2(
    major: u8,
    minor: u8,
    patch: u8,
    _suffix: *const c_char,
    logger: Option<NcclDebugLogger>,
) -> NcclResult {
    init(major, minor, patch, logger)
}

extern "C" fn init_v1(major: u8, minor: u8, patch: u8, _suffix: *const c_char) -> NcclResult {
    init(major, minor, patch, None)
}

fn init(major: u8, minor: u8, patch: u8, logger: Option<NcclDebugLogger>) -> NcclResult {
    let run = AssertUnwindSafe(|| {
        CACHE
            .get_or_init(|| {
                let env = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
                let answers = answers_for_process(&env, jiff::Timestamp::now());
                let nccl_debug = env("NCCL_DEBUG");
                log(
                    logger,
                    nccl_debug.as_deref(),
                    Level::Info,
                    &format!("railguard: env plugin initialising for NCCL {major}.{minor}.{patch}"),
                );
                for m in &answers.messages {
                    log(logger, nccl_debug.as_deref(), m.level, &m.text);
                }
                cache(answers)
            })
            .result
    });
    catch_unwind(run).unwrap_or_else(|_| {
        let _ = writeln!(
            std::io::stderr(),
            "railguard NCCL env plugin WARN: init panicked; NCCL gets the process environment unchanged"
        );
        NCCL_SUCCESS
    })
}

fn cache(answers: Answers) -> Cache {
    let values = answers
        .values
        .into_iter()
        // The node file's validation rejects NUL bytes; a value with one is left unanswered.
        .filter_map(|(k, v)| CString::new(v).ok().map(|v| (k, v)))
        .collect();
    Cache {
        values,
        result: if answers.init_error.is_some() {
            NCCL_SYSTEM_ERROR
        } else {
            NCCL_SUCCESS
        },
    }
}

extern "C" fn finalize() -> NcclResult {
    // Nothing to release: NCCL may still hold pointers `getEnv` returned.
    NCCL_SUCCESS
}

extern "C" fn get_env(name: *const c_char) -> *const c_char {
    if name.is_null() {
        return std::ptr::null();
    }
    let answered = catch_unwind(|| {
        // SAFETY: NCCL passes a NUL-terminated variable name that outlives the call.
        let key = unsafe { CStr::from_ptr(name) }.to_str().ok()?;
        CACHE.get()?.values.get(key).map(|v| v.as_ptr())
    });
    match answered {
        Ok(Some(value)) => value,
        // SAFETY: `name` is a NUL-terminated string (above); getenv only reads it.
        _ => unsafe { getenv(name) },
    }
}

fn log(logger: Option<NcclDebugLogger>, nccl_debug: Option<&str>, level: Level, text: &str) {
    match route(level, logger.is_some(), nccl_debug) {
        Route::Drop => {}
        Route::Stderr => {
            let word = match level {
                Level::Warn => "WARN",
                Level::Info => "INFO",
            };
            let _ = writeln!(std::io::stderr(), "railguard NCCL env plugin {word} {text}");
        }
        Route::NcclLogger => {
            let Some(logger) = logger else { return };
            let (nccl_level, flags) = match level {
                Level::Warn => (NCCL_LOG_WARN, NCCL_ALL),
                Level::Info => (NCCL_LOG_INFO, NCCL_INIT | NCCL_ENV),
            };
            let message = CString::new(text.replace('\0', " ")).unwrap_or_default();
            // SAFETY: the logger NCCL passed to init, called as `ncclDebugLogger_t` with a
            // "%s" format and one NUL-terminated string argument, all alive for the call.
            unsafe {
                logger(
                    nccl_level,
                    flags,
                    c"railguard-nccl-env".as_ptr(),
                    0,
                    c"%s".as_ptr(),
                    message.as_ptr(),
                )
            };
        }
    }
}
