//! The CUDA driver API calls railguard uses, resolved from a library opened at run time.
//!
//! This is one of the two modules of railguard that contain `unsafe` code (the other is the
//! ibverbs engine, `prober/src/rdma/verbs.rs`). Every call goes through [`Fns`], whose
//! pointers were resolved from the library that [`CudaDriver`] keeps open for as long as any
//! pointer can be called; every pointer argument is a live local or a buffer this module owns.
//! The signatures are those of `cuda.h` (CUDA 11.7 and later, the `_v2` entry points that
//! `cuda.h` maps the plain names to).
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::Arc;

use libloading::Library;

use crate::error::CudaError;

/// The library `dlopen` finds on a node with the NVIDIA driver.
pub const DEFAULT_LIBRARY: &str = "libcuda.so.1";

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuDevicePtr = u64;
type CuStream = *mut c_void;
type CuEvent = *mut c_void;

const CUDA_SUCCESS: CuResult = 0;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
const ATTR_GPU_DIRECT_RDMA_SUPPORTED: c_int = 116;
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
const ATTR_DMA_BUF_SUPPORTED: c_int = 124;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

struct Fns {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_by_pci_bus_id: unsafe extern "C" fn(*mut CuDevice, *const c_char) -> CuResult,
    device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    memset_d8: unsafe extern "C" fn(CuDevicePtr, u8, usize) -> CuResult,
    memset_d32: unsafe extern "C" fn(CuDevicePtr, c_uint, usize) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    mem_get_handle_for_address_range:
        unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, u64) -> CuResult,
    get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    event_create: unsafe extern "C" fn(*mut CuEvent, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(CuEvent, CuStream) -> CuResult,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, CuEvent, CuEvent) -> CuResult,
    event_destroy: unsafe extern "C" fn(CuEvent) -> CuResult,
}

/// The CUDA driver, loaded and initialised (`cuInit`).
pub struct CudaDriver {
    path: String,
    fns: Fns,
    version: i32,
    // Last: the pointers in `fns` stay valid while the library is open.
    _lib: Library,
}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish()
    }
}

/// A GPU as CUDA sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub ordinal: i32,
    /// `0000:04:00.0`, lower case (the form sysfs and NVML use).
    pub pci_bus_id: String,
    pub name: String,
    /// The device can export memory as a DMA-BUF (`CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`).
    pub dma_buf_supported: bool,
    /// The device supports GPUDirect RDMA (`CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`).
    pub gpu_direct_rdma_supported: bool,
    handle: CuDevice,
}

/// Device memory in the device's primary context; freed on drop.
pub struct DeviceBuffer {
    driver: Arc<CudaDriver>,
    device: CuDevice,
    ctx: CuContext,
    ptr: CuDevicePtr,
    len: usize,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("device", &self.device)
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the CUDA driver API is thread-safe; a primary context may be made current on any
// thread, and every operation of DeviceBuffer makes it current first.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; DeviceBuffer has no interior state that calls mutate.
unsafe impl Sync for DeviceBuffer {}

impl CudaDriver {
    /// Opens the driver library (`path`, else [`DEFAULT_LIBRARY`]) and runs `cuInit(0)`.
    pub fn load(path: Option<&std::path::Path>) -> Result<Arc<CudaDriver>, CudaError> {
        let shown = path.map_or_else(|| DEFAULT_LIBRARY.to_string(), |p| p.display().to_string());
        // SAFETY: loading a library runs its initialisers; libcuda's (and the double's) are
        // the library's own business and take no arguments from us.
        let lib = unsafe {
            match path {
                Some(p) => Library::new(p),
                None => Library::new(DEFAULT_LIBRARY),
            }
        }
        .map_err(|source| CudaError::Load {
            path: shown.clone(),
            source,
        })?;
        let fns = resolve(&lib, &shown)?;
        let mut driver = CudaDriver {
            path: shown,
            fns,
            version: 0,
            _lib: lib,
        };
        // SAFETY: cuInit takes flags (must be 0).
        driver.check("cuInit", unsafe { (driver.fns.init)(0) })?;
        let mut v: c_int = 0;
        // SAFETY: v is a live c_int.
        driver.check("cuDriverGetVersion", unsafe {
            (driver.fns.driver_get_version)(&mut v)
        })?;
        driver.version = v;
        Ok(Arc::new(driver))
    }

    /// The library that was loaded.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// `cuDriverGetVersion`, e.g. 12040 for CUDA 12.4.
    pub fn version(&self) -> i32 {
        self.version
    }

    /// Number of GPUs CUDA sees.
    pub fn device_count(&self) -> Result<u32, CudaError> {
        let mut n: c_int = 0;
        // SAFETY: n is a live c_int.
        self.check("cuDeviceGetCount", unsafe {
            (self.fns.device_get_count)(&mut n)
        })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// Every GPU CUDA sees, in CUDA's ordinal order.
    pub fn devices(&self) -> Result<Vec<Device>, CudaError> {
        let n = self.device_count()?;
        (0..n)
            .map(|i| {
                let mut d: CuDevice = 0;
                let ordinal = i32::try_from(i).unwrap_or(i32::MAX);
                // SAFETY: d is a live CUdevice.
                self.check("cuDeviceGet", unsafe {
                    (self.fns.device_get)(&mut d, ordinal)
                })?;
                self.describe(d, ordinal)
            })
            .collect()
    }

    /// The GPU at a PCI address (`0000:04:00.0`; the domain may be omitted).
    pub fn device_by_pci_bus_id(&self, bus_id: &str) -> Result<Device, CudaError> {
        let c = CString::new(bus_id).map_err(|_| CudaError::InvalidArgument {
            reason: format!("PCI bus id {bus_id:?} contains a NUL byte"),
        })?;
        let mut d: CuDevice = 0;
        // SAFETY: d is a live CUdevice, c a NUL-terminated string.
        let rc = unsafe { (self.fns.device_get_by_pci_bus_id)(&mut d, c.as_ptr()) };
        if rc != CUDA_SUCCESS {
            return Err(CudaError::NoDevice {
                selector: format!("at PCI {bus_id} ({})", self.error_name(rc)),
            });
        }
        let want = normalize_bus_id(bus_id);
        self.devices()?
            .into_iter()
            .find(|dev| dev.handle == d || dev.pci_bus_id == want)
            .ok_or(CudaError::NoDevice {
                selector: format!("at PCI {bus_id}"),
            })
    }

    fn describe(&self, d: CuDevice, ordinal: i32) -> Result<Device, CudaError> {
        let mut bus = [0 as c_char; 32];
        // SAFETY: bus is a live buffer of the length passed.
        self.check("cuDeviceGetPCIBusId", unsafe {
            (self.fns.device_get_pci_bus_id)(bus.as_mut_ptr(), bus.len() as c_int, d)
        })?;
        let mut name = [0 as c_char; 256];
        // SAFETY: name is a live buffer of the length passed.
        self.check("cuDeviceGetName", unsafe {
            (self.fns.device_get_name)(name.as_mut_ptr(), name.len() as c_int, d)
        })?;
        Ok(Device {
            ordinal,
            pci_bus_id: normalize_bus_id(&c_buf_string(&bus)),
            name: c_buf_string(&name),
            dma_buf_supported: self.attribute(d, ATTR_DMA_BUF_SUPPORTED)? != 0,
            gpu_direct_rdma_supported: self.attribute(d, ATTR_GPU_DIRECT_RDMA_SUPPORTED)? != 0,
            handle: d,
        })
    }

    fn attribute(&self, d: CuDevice, attr: c_int) -> Result<c_int, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: v is a live c_int.
        let rc = unsafe { (self.fns.device_get_attribute)(&mut v, attr, d) };
        // An attribute this driver does not know (CUDA_ERROR_INVALID_VALUE) means "no".
        if rc == 1 {
            return Ok(0);
        }
        self.check("cuDeviceGetAttribute", rc)?;
        Ok(v)
    }

    /// Allocates `len` bytes on `device` (in its primary context).
    pub fn alloc(self: &Arc<Self>, device: &Device, len: usize) -> Result<DeviceBuffer, CudaError> {
        if len == 0 {
            return Err(CudaError::InvalidArgument {
                reason: "a GPU buffer needs at least one byte".into(),
            });
        }
        let mut ctx: CuContext = std::ptr::null_mut();
        // SAFETY: ctx is a live CUcontext slot.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.fns.primary_ctx_retain)(&mut ctx, device.handle)
        })?;
        let release = |e: CudaError| {
            // SAFETY: the context was retained above and is released once on this path.
            unsafe { (self.fns.primary_ctx_release)(device.handle) };
            e
        };
        // SAFETY: ctx was just retained.
        self.check("cuCtxSetCurrent", unsafe {
            (self.fns.ctx_set_current)(ctx)
        })
        .map_err(release)?;
        let mut ptr: CuDevicePtr = 0;
        // SAFETY: ptr is a live CUdeviceptr slot; the context is current.
        self.check("cuMemAlloc", unsafe { (self.fns.mem_alloc)(&mut ptr, len) })
            .map_err(release)?;
        Ok(DeviceBuffer {
            driver: Arc::clone(self),
            device: device.handle,
            ctx,
            ptr,
            len,
        })
    }

    fn check(&self, call: &'static str, rc: CuResult) -> Result<(), CudaError> {
        if rc == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CudaError::Call {
                call,
                code: rc,
                name: self.error_name(rc),
            })
        }
    }

    fn error_name(&self, rc: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: p is a live pointer slot; on success it points to a static string.
        let ok = unsafe { (self.fns.get_error_name)(rc, &mut p) } == CUDA_SUCCESS;
        if ok && !p.is_null() {
            // SAFETY: cuGetErrorName returns a NUL-terminated static string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            format!("CUDA error {rc}")
        }
    }
}

/// A CUDA stream in a device's primary context (a `cudaStream_t` to NCCL); destroyed on drop.
pub struct Stream {
    // The buffer keeps the primary context retained; the stream lives in it.
    owner: DeviceBuffer,
    raw: CuStream,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.owner.device)
            .finish()
    }
}

// SAFETY: streams may be used from any thread once their context is current, which every
// operation makes it.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// The raw `CUstream`, for NCCL calls.
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }

    /// Makes the stream's context current on this thread (NCCL calls need it).
    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        self.owner.make_current()
    }

    /// Waits until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.owner.make_current()?;
        // SAFETY: raw was created by cuStreamCreate and is destroyed only on drop.
        self.owner.driver.check("cuStreamSynchronize", unsafe {
            (self.owner.driver.fns.stream_synchronize)(self.raw)
        })
    }
}

impl Stream {
    /// A new event on this stream (`cuEventCreate`, timing enabled).
    pub fn event(&self) -> Result<Event<'_>, CudaError> {
        self.owner.make_current()?;
        let mut raw: CuEvent = std::ptr::null_mut();
        // SAFETY: raw is a live CUevent slot; the stream's context is current.
        self.owner.driver.check("cuEventCreate", unsafe {
            (self.owner.driver.fns.event_create)(&mut raw, 0)
        })?;
        Ok(Event { stream: self, raw })
    }
}

/// A CUDA event of one stream; destroyed on drop. Work is timed between two of them on the
/// GPU's own clock (`cuEventElapsedTime`).
pub struct Event<'s> {
    stream: &'s Stream,
    raw: CuEvent,
}

impl std::fmt::Debug for Event<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("stream", self.stream)
            .finish()
    }
}

impl Event<'_> {
    /// Records the event on its stream, after the work queued so far (`cuEventRecord`).
    pub fn record(&self) -> Result<(), CudaError> {
        self.stream.owner.make_current()?;
        // SAFETY: both handles are live: the event until drop, the stream it borrows.
        self.stream.owner.driver.check("cuEventRecord", unsafe {
            (self.stream.owner.driver.fns.event_record)(self.raw, self.stream.raw)
        })
    }

    /// Seconds from `start` to this event, both recorded and completed (synchronize the
    /// stream first).
    pub fn seconds_since(&self, start: &Event<'_>) -> Result<f64, CudaError> {
        self.stream.owner.make_current()?;
        let mut ms: f32 = 0.0;
        // SAFETY: ms is a live f32; both events are live.
        self.stream
            .owner
            .driver
            .check("cuEventElapsedTime", unsafe {
                (self.stream.owner.driver.fns.event_elapsed_time)(&mut ms, start.raw, self.raw)
            })?;
        Ok(f64::from(ms) / 1e3)
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        if self.stream.owner.make_current().is_ok() {
            // SAFETY: created by cuEventCreate, destroyed once.
            unsafe { (self.stream.owner.driver.fns.event_destroy)(self.raw) };
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owner.make_current().is_ok() {
            // SAFETY: created by cuStreamCreate, destroyed once.
            unsafe { (self.owner.driver.fns.stream_destroy)(self.raw) };
        }
    }
}

impl CudaDriver {
    /// A new stream on `device`.
    pub fn stream(self: &Arc<Self>, device: &Device) -> Result<Stream, CudaError> {
        // A one-byte buffer holds the retained context for the stream's lifetime.
        let owner = self.alloc(device, 1)?;
        let mut raw: CuStream = std::ptr::null_mut();
        // SAFETY: raw is a live CUstream slot; the context is current after alloc.
        self.check("cuStreamCreate", unsafe {
            (self.fns.stream_create)(&mut raw, 0)
        })?;
        Ok(Stream { owner, raw })
    }
}

impl DeviceBuffer {
    /// The device address (what `ibv_reg_mr` registers with nvidia-peermem, and the iova of a
    /// DMA-BUF registration).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn make_current(&self) -> Result<(), CudaError> {
        // SAFETY: self.ctx is retained for the buffer's lifetime.
        self.driver.check("cuCtxSetCurrent", unsafe {
            (self.driver.fns.ctx_set_current)(self.ctx)
        })
    }

    /// Sets every byte to `value`.
    pub fn fill(&self, value: u8) -> Result<(), CudaError> {
        self.make_current()?;
        // SAFETY: the range is this allocation.
        self.driver.check("cuMemsetD8", unsafe {
            (self.driver.fns.memset_d8)(self.ptr, value, self.len)
        })
    }

    /// Sets the first `count` 32-bit words to `value` on the device (`cuMemsetD32`): a
    /// buffer of gigabytes is filled without a host copy of it.
    pub fn fill_u32(&self, value: u32, count: usize) -> Result<(), CudaError> {
        let bytes = count.checked_mul(4).ok_or(CudaError::InvalidArgument {
            reason: format!("{count} words overflow"),
        })?;
        self.bounds(bytes)?;
        self.make_current()?;
        // SAFETY: the range is within this allocation (checked above).
        self.driver.check("cuMemsetD32", unsafe {
            (self.driver.fns.memset_d32)(self.ptr, value, count)
        })
    }

    /// Copies the first `out.len()` bytes of the buffer to host memory.
    pub fn copy_to_host(&self, out: &mut [u8]) -> Result<(), CudaError> {
        self.copy_to_host_at(0, out)
    }

    /// Copies `out.len()` bytes from `offset` into the buffer to host memory (a large buffer
    /// is read back piece by piece).
    pub fn copy_to_host_at(&self, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        let end = offset
            .checked_add(out.len())
            .ok_or(CudaError::InvalidArgument {
                reason: format!("{offset} + {} bytes overflow", out.len()),
            })?;
        self.bounds(end)?;
        self.make_current()?;
        // SAFETY: out is a live host buffer of the length copied; the device range
        // [ptr + offset, ptr + end) is within this allocation (checked above).
        self.driver.check("cuMemcpyDtoH", unsafe {
            (self.driver.fns.memcpy_dtoh)(
                out.as_mut_ptr() as *mut c_void,
                self.ptr + offset as u64,
                out.len(),
            )
        })
    }

    /// Copies `data` to the start of the buffer.
    pub fn copy_from_host(&self, data: &[u8]) -> Result<(), CudaError> {
        self.bounds(data.len())?;
        self.make_current()?;
        // SAFETY: data is a live host buffer of the length copied; the device range is ours.
        self.driver.check("cuMemcpyHtoD", unsafe {
            (self.driver.fns.memcpy_htod)(self.ptr, data.as_ptr() as *const c_void, data.len())
        })
    }

    /// Exports the whole buffer as a DMA-BUF file descriptor
    /// (`cuMemGetHandleForAddressRange`), for `ibv_reg_dmabuf_mr`.
    pub fn export_dmabuf(&self) -> Result<OwnedFd, CudaError> {
        self.make_current()?;
        let mut fd: c_int = -1;
        // SAFETY: fd is a live c_int the driver writes the descriptor into.
        self.driver.check("cuMemGetHandleForAddressRange", unsafe {
            (self.driver.fns.mem_get_handle_for_address_range)(
                &mut fd as *mut c_int as *mut c_void,
                self.ptr,
                self.len,
                HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(CudaError::Call {
                call: "cuMemGetHandleForAddressRange",
                code: 0,
                name: format!("returned descriptor {fd}"),
            });
        }
        // SAFETY: the driver handed us a new descriptor; we own it from here.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn bounds(&self, n: usize) -> Result<(), CudaError> {
        if n > self.len {
            return Err(CudaError::InvalidArgument {
                reason: format!("{n} bytes do not fit a {}-byte GPU buffer", self.len),
            });
        }
        Ok(())
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Errors on free cannot be reported from drop; the process keeps running either way.
        if self.make_current().is_ok() {
            // SAFETY: ptr was allocated by cuMemAlloc and is freed once.
            unsafe { (self.driver.fns.mem_free)(self.ptr) };
        }
        // SAFETY: the primary context was retained once in alloc and is released once here.
        unsafe { (self.driver.fns.primary_ctx_release)(self.device) };
    }
}

fn resolve(lib: &Library, path: &str) -> Result<Fns, CudaError> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol is looked up by its cuda.h name and cast to the cuda.h
            // signature declared in `Fns`; the pointer is only called while `lib` is open.
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|source| {
                CudaError::Symbol {
                    path: path.to_string(),
                    symbol: $name,
                    source,
                }
            })?;
            *s
        }};
    }
    Ok(Fns {
        init: sym!("cuInit"),
        driver_get_version: sym!("cuDriverGetVersion"),
        device_get_count: sym!("cuDeviceGetCount"),
        device_get: sym!("cuDeviceGet"),
        device_get_by_pci_bus_id: sym!("cuDeviceGetByPCIBusId"),
        device_get_pci_bus_id: sym!("cuDeviceGetPCIBusId"),
        device_get_attribute: sym!("cuDeviceGetAttribute"),
        device_get_name: sym!("cuDeviceGetName"),
        primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
        primary_ctx_release: sym!("cuDevicePrimaryCtxRelease_v2"),
        ctx_set_current: sym!("cuCtxSetCurrent"),
        mem_alloc: sym!("cuMemAlloc_v2"),
        mem_free: sym!("cuMemFree_v2"),
        memset_d8: sym!("cuMemsetD8_v2"),
        memset_d32: sym!("cuMemsetD32_v2"),
        memcpy_htod: sym!("cuMemcpyHtoD_v2"),
        memcpy_dtoh: sym!("cuMemcpyDtoH_v2"),
        mem_get_handle_for_address_range: sym!("cuMemGetHandleForAddressRange"),
        get_error_name: sym!("cuGetErrorName"),
        stream_create: sym!("cuStreamCreate"),
        stream_synchronize: sym!("cuStreamSynchronize"),
        stream_destroy: sym!("cuStreamDestroy_v2"),
        event_create: sym!("cuEventCreate"),
        event_record: sym!("cuEventRecord"),
        event_elapsed_time: sym!("cuEventElapsedTime"),
        event_destroy: sym!("cuEventDestroy_v2"),
    })
}

fn c_buf_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `0000:04:00.0` in lower case; CUDA prints `00000000:04:00.0` (8-digit domain) and upper
/// case, sysfs and NVML print a 4-digit domain.
fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => {
            let d = u32::from_str_radix(domain, 16).unwrap_or(0);
            format!("{d:04x}:{rest}")
        }
        _ => format!("0000:{id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::normalize_bus_id;

    #[test]
    fn bus_ids_take_the_sysfs_form() {
        assert_eq!(normalize_bus_id("00000000:04:00.0"), "0000:04:00.0");
        assert_eq!(normalize_bus_id("0000:8A:00.0"), "0000:8a:00.0");
        assert_eq!(normalize_bus_id("04:00.0"), "0000:04:00.0");
    }
}
