//! NCCL's C API, resolved from `libnccl.so.2` opened at run time.
//!
//! The second `unsafe` module of this crate (see [`crate::driver`] for the first and the
//! rules both follow): the pointers in [`Fns`] come from the library [`Nccl`] keeps open,
//! and every buffer handed to NCCL is a [`DeviceBuffer`] that outlives the call and whose
//! stream is synchronised before the call returns. Signatures are those of `nccl.h` (2.x).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use libloading::Library;

use crate::driver::{DeviceBuffer, Stream};
use crate::error::NcclError;

/// The library `dlopen` finds where NCCL is installed (the `nvidia-nccl-cu12` wheel ships it).
pub const DEFAULT_NCCL_LIBRARY: &str = "libnccl.so.2";

/// Where the prober image carries NCCL: the `nvidia-nccl-cu12` wheel's `libnccl.so.2`
/// (docker/prober.Dockerfile), so a node certifies with the image as shipped.
pub const BUNDLED_NCCL_LIBRARY: &str = "/usr/lib/railguard/nccl/libnccl.so.2";

/// The library loaded when none is named: [`BUNDLED_NCCL_LIBRARY`] where it exists (the
/// prober image), else `None`: [`DEFAULT_NCCL_LIBRARY`] from the loader's path (a machine
/// with NCCL installed, an image built with its own).
pub fn bundled_nccl_library() -> Option<std::path::PathBuf> {
    let p = std::path::Path::new(BUNDLED_NCCL_LIBRARY);
    p.is_file().then(|| p.to_path_buf())
}

/// Bytes of an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

type NcclResult = c_int;
type NcclComm = *mut c_void;

#[repr(C)]
#[derive(Clone, Copy)]
struct RawUniqueId {
    internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclFloat32`.
const NCCL_FLOAT32: c_int = 7;
/// `ncclSum`.
const NCCL_SUM: c_int = 0;

struct Fns {
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    get_unique_id: unsafe extern "C" fn(*mut RawUniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut NcclComm, c_int, RawUniqueId, c_int) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclComm,
        *mut c_void,
    ) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

/// NCCL, loaded.
pub struct Nccl {
    path: String,
    fns: Fns,
    version: i32,
    _lib: Library,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

/// The rendezvous token of one communicator: created by rank 0, sent to every other rank
/// (railguard sends it over the campaign's authenticated peer channel).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The id carries rank 0's bootstrap address; not worth printing in full.
        write!(f, "UniqueId({:02x}{:02x}..)", self.0[0], self.0[1])
    }
}

/// One rank of a communicator; destroyed on drop.
pub struct Communicator {
    nccl: Arc<Nccl>,
    raw: NcclComm,
    pub rank: u32,
    pub nranks: u32,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .finish()
    }
}

// SAFETY: an NCCL communicator may be used from any one thread at a time; &mut self on the
// collective calls keeps it to one.
unsafe impl Send for Communicator {}

impl Nccl {
    /// Opens NCCL (`path`, else [`bundled_nccl_library`], else [`DEFAULT_NCCL_LIBRARY`] from
    /// the loader's path).
    pub fn load(path: Option<&std::path::Path>) -> Result<Arc<Nccl>, NcclError> {
        let bundled = if path.is_none() {
            bundled_nccl_library()
        } else {
            None
        };
        let path = path.or(bundled.as_deref());
        let shown = path.map_or_else(
            || DEFAULT_NCCL_LIBRARY.to_string(),
            |p| p.display().to_string(),
        );
        // SAFETY: loading runs the library's initialisers, which take nothing from us.
        let lib = unsafe {
            match path {
                Some(p) => Library::new(p),
                None => Library::new(DEFAULT_NCCL_LIBRARY),
            }
        }
        .map_err(|source| NcclError::Load {
            path: shown.clone(),
            source,
        })?;
        let fns = resolve(&lib, &shown)?;
        let mut nccl = Nccl {
            path: shown,
            fns,
            version: 0,
            _lib: lib,
        };
        let mut v: c_int = 0;
        // SAFETY: v is a live c_int.
        nccl.check("ncclGetVersion", unsafe { (nccl.fns.get_version)(&mut v) })?;
        nccl.version = v;
        Ok(Arc::new(nccl))
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// `ncclGetVersion`, e.g. 22105 for 2.21.5.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The version as NCCL prints it: `2.21.5`.
    pub fn version_string(&self) -> String {
        version_string(self.version)
    }

    /// `ncclGetUniqueId`: rank 0 calls this and sends the id to the other ranks.
    pub fn unique_id(&self) -> Result<UniqueId, NcclError> {
        let mut raw = RawUniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        // SAFETY: raw is a live ncclUniqueId.
        self.check("ncclGetUniqueId", unsafe {
            (self.fns.get_unique_id)(&mut raw)
        })?;
        Ok(UniqueId(raw.internal.map(|c| c as u8)))
    }

    /// `ncclCommInitRank`: joins the communicator of `id` as `rank` of `nranks`. Blocks until
    /// every rank has joined; the device of `stream` is the rank's GPU.
    pub fn init_rank(
        self: &Arc<Self>,
        id: &UniqueId,
        nranks: u32,
        rank: u32,
        stream: &Stream,
    ) -> Result<Communicator, NcclError> {
        if nranks == 0 || rank >= nranks {
            return Err(NcclError::InvalidArgument {
                reason: format!("rank {rank} of {nranks}"),
            });
        }
        stream.make_current()?;
        let raw_id = RawUniqueId {
            internal: id.0.map(|b| b as c_char),
        };
        let mut comm: NcclComm = std::ptr::null_mut();
        let n = c_int::try_from(nranks).map_err(|_| NcclError::InvalidArgument {
            reason: format!("{nranks} ranks"),
        })?;
        let r = c_int::try_from(rank).unwrap_or(c_int::MAX);
        // SAFETY: comm is a live ncclComm_t slot; the id is passed by value as nccl.h says.
        self.check("ncclCommInitRank", unsafe {
            (self.fns.comm_init_rank)(&mut comm, n, raw_id, r)
        })?;
        Ok(Communicator {
            nccl: Arc::clone(self),
            raw: comm,
            rank,
            nranks,
        })
    }

    fn check(&self, call: &'static str, rc: NcclResult) -> Result<(), NcclError> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string (or null).
        let p = unsafe { (self.fns.get_error_string)(rc) };
        let message = if p.is_null() {
            format!("NCCL error {rc}")
        } else {
            // SAFETY: non-null, static, NUL-terminated.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        Err(NcclError::Call {
            call,
            code: rc,
            message,
        })
    }
}

impl Communicator {
    /// `ncclAllReduce` (sum of `count` float32 values) from `send` into `recv` on `stream`,
    /// waiting for it to finish.
    pub fn all_reduce_sum_f32(
        &mut self,
        send: &DeviceBuffer,
        recv: &DeviceBuffer,
        count: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        let bytes = count.checked_mul(4).ok_or(NcclError::InvalidArgument {
            reason: format!("{count} elements overflow"),
        })?;
        if bytes > send.len() || bytes > recv.len() {
            return Err(NcclError::InvalidArgument {
                reason: format!(
                    "{count} float32 values do not fit buffers of {} and {} bytes",
                    send.len(),
                    recv.len()
                ),
            });
        }
        self.enqueue_all_reduce(send, recv, count, stream)?;
        stream.synchronize()?;
        Ok(())
    }

    /// Queues one all-reduce; the caller keeps both buffers alive until it synchronises the
    /// stream (private: only this module's sweep relies on that).
    fn enqueue_all_reduce(
        &mut self,
        send: &DeviceBuffer,
        recv: &DeviceBuffer,
        count: usize,
        stream: &Stream,
    ) -> Result<(), NcclError> {
        stream.make_current()?;
        // SAFETY: both buffers are live device allocations of at least 4 * count bytes
        // (checked by the callers), held until the stream is synchronised.
        self.nccl.check("ncclAllReduce", unsafe {
            (self.nccl.fns.all_reduce)(
                send.device_ptr() as *const c_void,
                recv.device_ptr() as *mut c_void,
                count,
                NCCL_FLOAT32,
                NCCL_SUM,
                self.raw,
                stream.raw(),
            )
        })
    }

    /// The timed all-reduce sweep of one rank: for each size, `warmup` untimed and `iters`
    /// timed float32 sums queued back to back and waited for once (as nccl-tests times
    /// them), then a correctness check of the result. The time is the GPU's, between CUDA
    /// events recorded around the timed sums on the rank's stream. Every rank must call
    /// this with the same sizes and counts.
    pub fn all_reduce_sweep(
        &mut self,
        cuda: &Arc<crate::CudaDriver>,
        device: &crate::Device,
        stream: &Stream,
        sizes: &[usize],
        warmup: u32,
        iters: u32,
    ) -> Result<Vec<crate::collective::SweepPoint>, NcclError> {
        let max = sizes.iter().copied().max().unwrap_or(0);
        if max < 4 || iters == 0 {
            return Err(NcclError::InvalidArgument {
                reason: format!("sweep up to {max} bytes with {iters} iterations"),
            });
        }
        let send = cuda.alloc(device, max)?;
        let recv = cuda.alloc(device, max)?;
        let (started, ended) = (stream.event()?, stream.event()?);
        let mut out = Vec::with_capacity(sizes.len());
        for &bytes in sizes {
            let count = bytes / 4;
            if count == 0 {
                continue;
            }
            let mine = crate::collective::rank_value(self.rank);
            // Filled on the device: a host copy of an 8 GiB message per rank would not fit
            // the prober's memory. The legacy-stream memset is ordered before `stream`'s
            // work (a blocking stream, flags 0).
            send.fill_u32(mine.to_bits(), count)?;
            for _ in 0..warmup {
                self.enqueue_all_reduce(&send, &recv, count, stream)?;
            }
            stream.synchronize()?;
            started.record()?;
            for _ in 0..iters {
                self.enqueue_all_reduce(&send, &recv, count, stream)?;
            }
            ended.record()?;
            stream.synchronize()?;
            let per_op = ended.seconds_since(&started)? / f64::from(iters);
            let want = crate::collective::expected_sum(self.nranks);
            let wrong = count_wrong(&recv, count, want)?;
            out.push(crate::collective::SweepPoint::new(
                count * 4,
                per_op,
                self.nranks,
                wrong,
            ));
        }
        Ok(out)
    }
}

/// Bytes of the result read back at a time: the check holds two of these on the host, not
/// the whole message.
const CHECK_CHUNK_BYTES: usize = 4 << 20;

/// Elements of the first `count` float32 values of `recv` that are not `want`, read back
/// chunk by chunk; a chunk equal to the expected bytes is passed by one comparison.
fn count_wrong(recv: &DeviceBuffer, count: usize, want: f32) -> Result<u64, NcclError> {
    let total = count * 4;
    let expected = f32_bytes(want, CHECK_CHUNK_BYTES.min(total) / 4);
    let mut host = vec![0u8; expected.len()];
    let mut wrong = 0u64;
    let mut offset = 0;
    while offset < total {
        let n = expected.len().min(total - offset);
        recv.copy_to_host_at(offset, &mut host[..n])?;
        if host[..n] != expected[..n] {
            wrong += host[..n]
                .chunks_exact(4)
                .filter(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) != want)
                .count() as u64;
        }
        offset += n;
    }
    Ok(wrong)
}

/// `ncclGetVersion`'s code as NCCL prints it. nccl.h's `NCCL_VERSION(X,Y,Z)` is
/// X*1000 + Y*100 + Z up to 2.8 and X*10000 + Y*100 + Z from 2.9 on (NVIDIA/nccl
/// `src/nccl.h.in`); no 2.8 code reaches 10000, no later one falls below it.
pub fn version_string(code: i32) -> String {
    if code >= 10000 {
        format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100)
    } else {
        format!("{}.{}.{}", code / 1000, (code / 100) % 10, code % 100)
    }
}

fn f32_bytes(v: f32, count: usize) -> Vec<u8> {
    let one = v.to_ne_bytes();
    let mut out = Vec::with_capacity(count * 4);
    for _ in 0..count {
        out.extend_from_slice(&one);
    }
    out
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // SAFETY: created by ncclCommInitRank, destroyed once.
        unsafe { (self.nccl.fns.comm_destroy)(self.raw) };
    }
}

fn resolve(lib: &Library, path: &str) -> Result<Fns, NcclError> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: looked up by its nccl.h name and cast to the nccl.h signature in `Fns`;
            // only called while `lib` is open.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|source| {
                NcclError::Symbol {
                    path: path.to_string(),
                    symbol: $name,
                    source,
                }
            })?;
            *s
        }};
    }
    Ok(Fns {
        get_version: sym!("ncclGetVersion"),
        get_unique_id: sym!("ncclGetUniqueId"),
        comm_init_rank: sym!("ncclCommInitRank"),
        all_reduce: sym!("ncclAllReduce"),
        comm_destroy: sym!("ncclCommDestroy"),
        get_error_string: sym!("ncclGetErrorString"),
    })
}

#[cfg(test)]
mod tests {
    use super::version_string;

    #[test]
    fn version_codes_read_as_nccl_h_encodes_them() {
        // NCCL_VERSION(2, 21, 5), NCCL_VERSION(2, 32, 3) and an old NCCL_VERSION(2, 8, 4).
        assert_eq!(version_string(22105), "2.21.5");
        assert_eq!(version_string(23203), "2.32.3");
        assert_eq!(version_string(2804), "2.8.4");
        assert_eq!(version_string(2419), "2.4.19");
    }
}
