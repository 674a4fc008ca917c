//! The real RDMA engine: RC queue pairs and RDMA WRITE through libibverbs.
//!
//! This is the crate's only `unsafe` code. It calls libibverbs through `ibverbs-sys` (the FFI
//! layer of the `ibverbs` crate): the safe `ibverbs` API hard-codes port 1, posts only SEND and
//! hides the raw QP/MR handles, and RDMA WRITE needs all of those. Device discovery uses the
//! safe `ibverbs::devices()`.
//!
//! Safety rules kept throughout:
//! - every handle is owned by exactly one RAII wrapper that releases it once, in reverse order
//!   of creation (fields of [`VerbsEndpoint`] are declared in drop order);
//! - a registered buffer lives in the endpoint as long as its memory region, and is never
//!   reallocated (its length is fixed at registration);
//! - `ibv_post_send`/`ibv_poll_cq` are static inline functions in `verbs.h`, so they are called
//!   through the context's ops table exactly as the header does;
//! - a GPU buffer ([`GpuBuffer`], allocated through the CUDA driver API) is registered either
//!   as a DMA-BUF (`ibv_reg_dmabuf_mr`, iova = the device pointer) or by its device pointer
//!   (`ibv_reg_mr`, which only nvidia-peermem can resolve); in both cases work requests address
//!   it by the device pointer, exactly like a host buffer by its virtual address;
//! - libibverbs objects are thread-safe; an endpoint is used by one thread at a time (`&mut`),
//!   which is why it may be `Send`;
//! - the latency ping-pong touches a registered host buffer only through volatile reads and
//!   writes of single bytes (the HCA writes it behind the compiler's back), and never a GPU
//!   buffer (its writes carry an immediate instead).
//!
//! Latency is measured as perftest's `ib_write_lat` does (a ping-pong of 2-byte writes, half
//! the round trip; see [`super::PingPongLatency`]), bandwidth as its `ib_write_bw` does.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::ffi::CStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use super::gpu_memory::{
    no_path_reason, registration_order, GpuBuffer, GpuMemory, GpuRegistrationReport,
    RegistrationAttempt, RegistrationPath,
};
use super::{
    half_round_trips, loopback_via_endpoints, MemoryKind, PeerRdmaEngine, PingPongLatency,
    PingPongWait, QpInfo, RailBenchRequest, RailBenchResult, RdmaEndpoint, RdmaEngine, RdmaError,
    SizePoint, TrafficClass,
};

/// Outstanding writes per QP during the bandwidth run: perftest's `DEF_TX_BW`
/// (`src/perftest_parameters.h`).
const TX_DEPTH: u32 = 128;
/// One write in this many is signaled: perftest's `DEF_CQ_MOD` (never above the tx depth,
/// `src/perftest_parameters.c`). A completion then stands for every write before it (RC
/// completes in order), so the CPU polls one CQE per 100 writes as `ib_write_bw` does.
const CQ_MOD: u32 = 100;
/// Each size's post-to-completion time is averaged over at most this many writes.
const MAX_LATENCY_ITERS: u32 = 1000;
/// From this size on, the latency run takes at most 10 samples.
const LARGE_MESSAGE_BYTES: usize = 1 << 20;
/// Inline data asked for at QP creation: perftest's `DEF_INLINE_WRITE`, what `ib_write_lat`
/// inlines on mlx5 (`ctx_set_max_inline`, `src/perftest_parameters.c`). perftest then lowers
/// it to the QP's cap (`src/perftest_resources.c`); a device that refuses it gets no inline.
const INLINE_WRITE: u32 = 220;
/// Receive requests kept posted for the write-with-immediate ping-pong (GPU memory).
const RX_DEPTH: u32 = 16;
/// How long a ping-pong wait spins before it starts yielding the CPU: longer than any real
/// HCA's half round trip, so only Soft-RoCE (whose work runs in the kernel, on the same small
/// VM's CPU) ever yields.
const PURE_SPIN: Duration = Duration::from_micros(20);
/// Local ACK timeout exponent: 4.096 µs · 2^14 ≈ 67 ms per try, 7 retries ≈ 0.5 s until a dead
/// peer shows up as `IBV_WC_RETRY_EXC_ERR`.
const ACK_TIMEOUT: u8 = 14;
const RETRY_CNT: u8 = 7;

/// Real verbs. Configuration is plain data; no device is touched until a call.
#[derive(Debug, Clone)]
pub struct VerbsEngine {
    /// GID table index to use; `None` uses the one NCCL would (see `choose_gid`).
    pub gid_index: Option<u32>,
    /// How long one completion may take before the test is abandoned.
    pub completion_timeout: Duration,
    /// Where GPU-memory buffers come from (GPUDirect RDMA tests).
    pub gpu_memory: GpuMemory,
}

impl Default for VerbsEngine {
    fn default() -> Self {
        VerbsEngine {
            gid_index: None,
            completion_timeout: Duration::from_secs(10),
            gpu_memory: GpuMemory::default(),
        }
    }
}

impl VerbsEngine {
    pub fn new() -> Self {
        Self::default()
    }
}

impl RdmaEngine for VerbsEngine {
    fn loopback(&self, req: &RailBenchRequest) -> Result<RailBenchResult, RdmaError> {
        loopback_via_endpoints(self, req)
    }

    fn devices(&self) -> Result<Vec<String>, RdmaError> {
        device_names()
    }
}

impl PeerRdmaEngine for VerbsEngine {
    fn open_endpoint(
        &self,
        hca: &str,
        port: u32,
        memory: MemoryKind,
        buffer_bytes: usize,
    ) -> Result<Box<dyn RdmaEndpoint>, RdmaError> {
        Ok(Box::new(VerbsEndpoint::open(
            self,
            hca,
            port,
            memory,
            buffer_bytes,
        )?))
    }
}

/// Names of the RDMA devices; a kernel without RDMA (ENOSYS) or an empty list is `NoDevices`.
pub fn device_names() -> Result<Vec<String>, RdmaError> {
    let list = match ibverbs::devices() {
        Ok(list) => list,
        Err(e) if e.raw_os_error() == Some(libc_enosys()) => return Err(RdmaError::NoDevices),
        Err(e) => {
            return Err(RdmaError::Verbs {
                op: "ibv_get_device_list",
                errno: e.raw_os_error().unwrap_or(0),
            })
        }
    };
    let names: Vec<String> = list
        .iter()
        .filter_map(|d| d.name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    if names.is_empty() {
        return Err(RdmaError::NoDevices);
    }
    Ok(names)
}

const fn libc_enosys() -> i32 {
    38
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn port_state_name(state: ffi::ibv_port_state::Type) -> &'static str {
    match state {
        ffi::ibv_port_state::IBV_PORT_NOP => "NOP",
        ffi::ibv_port_state::IBV_PORT_DOWN => "DOWN",
        ffi::ibv_port_state::IBV_PORT_INIT => "INIT",
        ffi::ibv_port_state::IBV_PORT_ARMED => "ARMED",
        ffi::ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE",
        ffi::ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER",
        _ => "UNKNOWN",
    }
}

fn wc_status_text(status: ffi::ibv_wc_status::Type) -> String {
    // SAFETY: ibv_wc_status_str returns a pointer to a static NUL-terminated string for any
    // value (unknown values map to "unknown").
    let text = unsafe { ffi::ibv_wc_status_str(status) };
    if text.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-null, static, NUL-terminated (see above).
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// A verbs object this module created, with the call that releases it: dropped, it is
/// released once. [`VerbsEndpoint`]'s field order drops the QP before its MR, CQ, PD and
/// context.
struct Owned<T>(*mut T, unsafe extern "C" fn(*mut T) -> c_int);

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        // SAFETY: the pointer came from the call its release undoes (ibv_open_device and
        // ibv_close_device, ibv_alloc_pd and ibv_dealloc_pd, ibv_create_cq and
        // ibv_destroy_cq, ibv_reg_mr or ibv_reg_dmabuf_mr and ibv_dereg_mr, ibv_create_qp
        // and ibv_destroy_qp), is released only here, and everything made from it is owned
        // by fields dropped before this one. A registration is dropped before its buffer.
        unsafe { (self.1)(self.0) };
    }
}

type Context = Owned<ffi::ibv_context>;
type Pd = Owned<ffi::ibv_pd>;
type Cq = Owned<ffi::ibv_cq>;
type Mr = Owned<ffi::ibv_mr>;
type Qp = Owned<ffi::ibv_qp>;

/// The memory an endpoint registers: never moved or resized while registered.
enum Buffer {
    Host(Vec<u8>),
    Gpu {
        gpu: GpuBuffer,
        report: GpuRegistrationReport,
        /// The DMA-BUF the MR was made from (DMA-BUF path only); closed after the MR.
        _dmabuf: Option<OwnedFd>,
    },
}

impl Buffer {
    /// The address work requests use: the virtual address, or the device pointer.
    fn addr(&self) -> u64 {
        match self {
            Buffer::Host(v) => v.as_ptr() as u64,
            Buffer::Gpu { gpu, .. } => gpu.buffer.device_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Buffer::Host(v) => v.len(),
            Buffer::Gpu { gpu, .. } => gpu.buffer.len(),
        }
    }
}

/// One RC QP with a registered buffer (host or GPU memory). Field order is drop order.
pub struct VerbsEndpoint {
    qp: Qp,
    mr: Mr,
    cq: Cq,
    _pd: Pd,
    _ctx: Context,
    /// Registered memory; must outlive `mr` (declared after it).
    buf: Buffer,
    hca: String,
    port: u32,
    psn: u32,
    lid: u16,
    gid: [u8; 16],
    gid_index: u32,
    active_mtu: u32,
    ethernet: bool,
    timeout: Duration,
    connected: bool,
    /// Largest write this QP can send inline (0: none).
    inline_cap: u32,
    /// Ping-pong: send completions polled but not yet waited for, and the immediates of
    /// writes that arrived (a QP has one CQ, so either may turn up while waiting for the other).
    pp_sends: u32,
    pp_imms: VecDeque<u32>,
}

// SAFETY: libibverbs objects may be used from any thread; the endpoint is only used through
// `&mut self` (one thread at a time) and owns everything it points to.
unsafe impl Send for VerbsEndpoint {}

fn open_device(hca: &str) -> Result<Context, RdmaError> {
    let available = device_names()?;
    let mut n: c_int = 0;
    // SAFETY: n is a valid out-pointer; the list is freed below after opening.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(RdmaError::NoDevices);
    }
    let mut ctx = ptr::null_mut();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds n valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: dev is valid while the list is alive; the name is NUL-terminated.
        let name = unsafe { CStr::from_ptr(ffi::ibv_get_device_name(dev)) };
        if name.to_bytes() == hca.as_bytes() {
            // SAFETY: dev is valid; the context stays valid after the list is freed.
            ctx = unsafe { ffi::ibv_open_device(dev) };
            if ctx.is_null() {
                let errno = last_errno();
                // SAFETY: list came from ibv_get_device_list.
                unsafe { ffi::ibv_free_device_list(list) };
                return Err(RdmaError::Verbs {
                    op: "ibv_open_device",
                    errno,
                });
            }
            break;
        }
    }
    // SAFETY: list came from ibv_get_device_list and is freed once.
    unsafe { ffi::ibv_free_device_list(list) };
    if ctx.is_null() {
        return Err(RdmaError::DeviceNotFound {
            hca: hca.to_string(),
            available,
        });
    }
    Ok(Owned(ctx, ffi::ibv_close_device))
}

/// The answer of a post call: 0 is posted, anything else the verbs error.
fn posted(op: &'static str, rc: c_int) -> Result<(), RdmaError> {
    match rc {
        0 => Ok(()),
        rc => Err(verbs_err(op, rc)),
    }
}

fn verbs_err(op: &'static str, rc: c_int) -> RdmaError {
    // Verbs calls return either -1 with errno set or a positive errno.
    let errno = if rc > 0 { rc } else { last_errno() };
    RdmaError::Verbs { op, errno }
}

/// Registers a new host buffer of `len` bytes, filled with a pattern of its own (so a target
/// buffer never holds the source's bytes before a write lands).
fn register_host(pd: &Pd, len: usize, access: c_int) -> Result<(Mr, Buffer), RdmaError> {
    let mut buf = vec![0u8; len];
    let mut x: u64 = rand::random::<u64>() | 1;
    for b in buf.iter_mut() {
        // xorshift64: cheap, and two buffers' streams never line up in practice.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    // SAFETY: buf is a live allocation of buf.len() bytes that is neither moved nor resized
    // while registered (it is owned by the endpoint and dropped after the MR).
    let mr = unsafe { ffi::ibv_reg_mr(pd.0, buf.as_mut_ptr() as *mut c_void, buf.len(), access) };
    if mr.is_null() {
        return Err(verbs_err("ibv_reg_mr", -1));
    }
    Ok((Owned(mr, ffi::ibv_dereg_mr), Buffer::Host(buf)))
}

/// Allocates `len` bytes on GPU `gpu` and registers them by the first path of the profile's
/// order that works; the report says which, and why the others before it did not.
fn register_gpu(
    pd: &Pd,
    memory: &GpuMemory,
    gpu: u32,
    len: usize,
    access: c_int,
) -> Result<(Mr, Buffer), RdmaError> {
    let buffer = memory.alloc(gpu, len)?;
    let mut failed = Vec::new();
    for &path in registration_order(memory.registration) {
        let registered = match path {
            RegistrationPath::DmaBuf => register_dmabuf(pd, &buffer, access),
            RegistrationPath::PeerMem => register_peermem(pd, &buffer, access).map(|mr| (mr, None)),
        };
        match registered {
            Ok((mr, dmabuf)) => {
                let report = GpuRegistrationReport {
                    gpu,
                    pci_bus_id: buffer.device.pci_bus_id.clone(),
                    path,
                    failed,
                };
                return Ok((
                    mr,
                    Buffer::Gpu {
                        gpu: buffer,
                        report,
                        _dmabuf: dmabuf,
                    },
                ));
            }
            Err(error) => failed.push(RegistrationAttempt { path, error }),
        }
    }
    Err(RdmaError::GpuMemoryUnavailable {
        gpu,
        reason: no_path_reason(memory.registration, &failed),
    })
}

/// DMA-BUF: the driver exports the allocation, the HCA's driver imports it.
fn register_dmabuf(
    pd: &Pd,
    buffer: &GpuBuffer,
    access: c_int,
) -> Result<(Mr, Option<OwnedFd>), String> {
    if !buffer.device.dma_buf_supported {
        return Err(format!(
            "GPU {} does not support DMA-BUF export (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0; \
             it needs an open kernel module driver and kernel 5.12 or later)",
            buffer.device.pci_bus_id
        ));
    }
    let fd = buffer
        .buffer
        .export_dmabuf()
        .map_err(|e| railguard_api::error::error_chain(&e))?;
    let dev_ptr = buffer.buffer.device_ptr();
    // SAFETY: pd is live; fd is a DMA-BUF of exactly buffer.len() bytes owned by the caller
    // and kept open until after the MR is deregistered; the iova is only a number the HCA
    // uses to address the region.
    let mr = unsafe {
        ffi::ibv_reg_dmabuf_mr(
            pd.0,
            0,
            buffer.buffer.len(),
            dev_ptr,
            fd.as_raw_fd(),
            access,
        )
    };
    if mr.is_null() {
        return Err(format!(
            "ibv_reg_dmabuf_mr failed: {} (the HCA driver cannot import DMA-BUFs)",
            errno_text(last_errno())
        ));
    }
    Ok((Owned(mr, ffi::ibv_dereg_mr), Some(fd)))
}

/// nvidia-peermem: the device pointer is registered as if it were host memory; only a peer
/// memory client in the kernel can pin it.
fn register_peermem(pd: &Pd, buffer: &GpuBuffer, access: c_int) -> Result<Mr, String> {
    let dev_ptr = buffer.buffer.device_ptr();
    // SAFETY: pd is live; the device allocation of buffer.len() bytes outlives the MR (both
    // are owned by the endpoint, the MR dropped first). Without a peer memory client the
    // kernel rejects the range; nothing is dereferenced in user space.
    let mr = unsafe {
        ffi::ibv_reg_mr(
            pd.0,
            dev_ptr as usize as *mut c_void,
            buffer.buffer.len(),
            access,
        )
    };
    if mr.is_null() {
        let errno = last_errno();
        let module = if std::path::Path::new("/sys/module/nvidia_peermem").exists() {
            "nvidia_peermem is loaded"
        } else {
            "nvidia_peermem is not loaded"
        };
        return Err(format!(
            "ibv_reg_mr on the device pointer failed: {} ({module})",
            errno_text(errno)
        ));
    }
    Ok(Owned(mr, ffi::ibv_dereg_mr))
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

impl VerbsEndpoint {
    fn open(
        engine: &VerbsEngine,
        hca: &str,
        port: u32,
        memory: MemoryKind,
        buffer_bytes: usize,
    ) -> Result<Self, RdmaError> {
        let port_num = u8::try_from(port).map_err(|_| RdmaError::InvalidRequest {
            reason: format!("port {port} is out of range 1..=255"),
        })?;
        let ctx = open_device(hca)?;

        let mut attr = ffi::ibv_port_attr::default();
        // SAFETY: ctx is open; attr is a full ibv_port_attr (larger than the compat layout the
        // exported symbol fills).
        let rc = unsafe { ffi::ibv_query_port(ctx.0, port_num, &mut attr as *mut _ as *mut _) };
        if rc != 0 {
            // EINVAL: the device has no such port; same answer as the simulated engine.
            return Err(match verbs_err("ibv_query_port", rc) {
                RdmaError::Verbs { errno: 22, .. } => RdmaError::PortNotActive {
                    hca: hca.to_string(),
                    port,
                    state: "absent".into(),
                },
                other => other,
            });
        }
        if attr.state != ffi::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(RdmaError::PortNotActive {
                hca: hca.to_string(),
                port,
                state: port_state_name(attr.state).into(),
            });
        }
        let ethernet = u32::from(attr.link_layer) == ffi::IBV_LINK_LAYER_ETHERNET;
        let (gid_index, gid) = choose_gid(
            &ctx,
            hca,
            port_num,
            ethernet,
            attr.gid_tbl_len,
            engine.gid_index,
        )?;

        // SAFETY: ctx is open.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.0) };
        if pd.is_null() {
            return Err(verbs_err("ibv_alloc_pd", -1));
        }
        let pd = Owned(pd, ffi::ibv_dealloc_pd);
        // SAFETY: ctx is open; no completion channel.
        let cq = unsafe {
            ffi::ibv_create_cq(
                ctx.0,
                (TX_DEPTH * 2) as c_int,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(verbs_err("ibv_create_cq", -1));
        }
        let cq = Owned(cq, ffi::ibv_destroy_cq);

        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        let (mr, buf) = match memory {
            MemoryKind::Host => register_host(&pd, buffer_bytes.max(64), access.0 as c_int)?,
            MemoryKind::Gpu { gpu } => register_gpu(
                &pd,
                &engine.gpu_memory,
                gpu,
                buffer_bytes.max(64),
                access.0 as c_int,
            )?,
        };

        let create = |max_inline_data: u32| {
            let mut init = ffi::ibv_qp_init_attr {
                qp_context: ptr::null_mut(),
                send_cq: cq.0,
                recv_cq: cq.0,
                srq: ptr::null_mut(),
                cap: ffi::ibv_qp_cap {
                    max_send_wr: TX_DEPTH,
                    max_recv_wr: RX_DEPTH,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data,
                },
                qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: pd and cq are live; init is fully initialised; on success the provider
            // writes the QP's actual caps back into init.cap.
            let qp = unsafe { ffi::ibv_create_qp(pd.0, &mut init) };
            (!qp.is_null()).then(|| {
                (
                    Owned(qp, ffi::ibv_destroy_qp),
                    init.cap.max_inline_data.min(max_inline_data),
                )
            })
        };
        let (qp, inline_cap) = match create(INLINE_WRITE).or_else(|| create(0)) {
            Some(created) => created,
            None => return Err(verbs_err("ibv_create_qp", -1)),
        };

        let mut init_attr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num,
            qp_access_flags: access.0,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ffi::ibv_qp_attr_mask::IBV_QP_PORT
            | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        // SAFETY: qp is live; attr and mask describe the RESET->INIT transition.
        let rc = unsafe { ffi::ibv_modify_qp(qp.0, &mut init_attr, mask.0 as c_int) };
        if rc != 0 {
            return Err(verbs_err("ibv_modify_qp(INIT)", rc));
        }

        Ok(VerbsEndpoint {
            qp,
            mr,
            cq,
            _pd: pd,
            _ctx: ctx,
            buf,
            hca: hca.to_string(),
            port,
            psn: rand::random::<u32>() & 0x00ff_ffff,
            lid: attr.lid,
            gid,
            gid_index,
            active_mtu: attr.active_mtu,
            ethernet,
            timeout: engine.completion_timeout,
            connected: false,
            inline_cap,
            pp_sends: 0,
            pp_imms: VecDeque::new(),
        })
    }

    fn qp_num(&self) -> u32 {
        // SAFETY: qp is live; qp_num is set at creation and never changes.
        unsafe { (*self.qp.0).qp_num }
    }

    fn keys(&self) -> (u32, u32) {
        // SAFETY: mr is live; keys are set at registration and never change.
        unsafe { ((*self.mr.0).lkey, (*self.mr.0).rkey) }
    }

    /// Posts one RDMA WRITE of `len` bytes from the start of our buffer to the start of
    /// `remote`'s; `signaled` asks for its completion (the QP is created with `sq_sig_all = 0`).
    fn post_write(
        &mut self,
        remote: &QpInfo,
        len: usize,
        wr_id: u64,
        signaled: bool,
    ) -> Result<(), RdmaError> {
        let flags = if signaled {
            ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        self.post(remote.addr, remote.rkey, len, wr_id, flags, None)
    }

    /// Posts one RDMA WRITE (with `imm`: WRITE_WITH_IMM, the immediate in host order) of `len`
    /// bytes from the start of our buffer to `remote_addr`.
    fn post(
        &mut self,
        remote_addr: u64,
        rkey: u32,
        len: usize,
        wr_id: u64,
        send_flags: u32,
        imm: Option<u32>,
    ) -> Result<(), RdmaError> {
        let (lkey, _) = self.keys();
        let mut sge = ffi::ibv_sge {
            addr: self.buf.addr(),
            length: len as u32,
            lkey,
        };
        let mut wr = ffi::ibv_send_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: if imm.is_some() {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            },
            send_flags,
            ..Default::default()
        };
        if let Some(imm) = imm {
            // The verbs carry the immediate in network byte order.
            wr.__bindgen_anon_1.imm_data = imm.to_be();
        }
        wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: qp is live and connected; wr/sge point to locals valid for the call and to
        // our registered buffer (len <= buf.len(), checked by the caller; an inline write is
        // only asked for host memory, which the provider copies from at this call); post_send
        // is the provider's entry, exactly what the inline ibv_post_send calls.
        let rc = unsafe {
            let ctx = (*self.qp.0).context;
            match (*ctx).ops.post_send {
                Some(post_send) => post_send(self.qp.0, &mut wr, &mut bad),
                None => libc_enosys(),
            }
        };
        posted("ibv_post_send", rc)
    }

    /// Posts one receive request without buffers: a WRITE_WITH_IMM consumes one to deliver
    /// its immediate, and places its data by the address it carries.
    fn post_recv(&mut self) -> Result<(), RdmaError> {
        let mut wr = ffi::ibv_recv_wr {
            wr_id: 0,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: qp is live; wr is a local valid for the call with no scatter entries;
        // post_recv is the provider's entry, exactly what the inline ibv_post_recv calls.
        let rc = unsafe {
            let ops = &(*(*self.qp.0).context).ops;
            ops.post_recv
                .map_or_else(libc_enosys, |post| post(self.qp.0, &mut wr, &mut bad))
        };
        posted("ibv_post_recv", rc)
    }

    /// One `ibv_poll_cq` for up to `wcs.len()` completions; an error completion is an error.
    fn poll_once(&mut self, wcs: &mut [ffi::ibv_wc]) -> Result<usize, RdmaError> {
        // SAFETY: cq is live; wcs is a valid array of wcs.len() entries; poll_cq is the
        // provider's entry, exactly what the inline ibv_poll_cq calls.
        let n = unsafe {
            let ctx = (*self.cq.0).context;
            match (*ctx).ops.poll_cq {
                Some(poll_cq) => poll_cq(self.cq.0, wcs.len() as c_int, wcs.as_mut_ptr()),
                None => -libc_enosys(),
            }
        };
        if n < 0 {
            return Err(RdmaError::Verbs {
                op: "ibv_poll_cq",
                errno: -n,
            });
        }
        let n = n as usize;
        for wc in &wcs[..n] {
            if let Some((status, _vendor)) = wc.error() {
                return Err(RdmaError::WorkCompletion {
                    hca: self.hca.clone(),
                    op: "RDMA WRITE",
                    status: wc_status_text(status),
                    status_code: status,
                });
            }
        }
        Ok(n)
    }

    /// Polls until `want` completions arrived (or one failed, or the timeout passed).
    fn poll(&mut self, want: usize, wcs: &mut [ffi::ibv_wc]) -> Result<usize, RdmaError> {
        let deadline = Instant::now() + self.timeout;
        let mut spins: u32 = 0;
        let want = want.min(wcs.len());
        loop {
            let n = self.poll_once(&mut wcs[..want])?;
            if n > 0 {
                return Ok(n);
            }
            spins = spins.wrapping_add(1);
            if spins & 0xff == 0 {
                if Instant::now() > deadline {
                    return Err(RdmaError::Timeout {
                        op: format!("RDMA WRITE completion on {}", self.hca),
                        after_ms: self.timeout.as_millis() as u64,
                    });
                }
                // Soft-RoCE completes in kernel context: let it run on small VMs.
                std::thread::yield_now();
            }
        }
    }

    fn measure(
        &mut self,
        remote: &QpInfo,
        bytes: usize,
        iterations: u32,
    ) -> Result<SizePoint, RdmaError> {
        let mut wcs = vec![ffi::ibv_wc::default(); TX_DEPTH as usize];
        // Warm-up as perftest's --perform_warm_up (`src/perftest_resources.c`, `perform_warm_up`):
        // a tx depth of writes, the last one signaled, before anything is timed; never more
        // writes than the run itself makes (a 10-write sweep on Soft-RoCE stays short).
        let warmup = TX_DEPTH.min(iterations.max(1));
        for i in 0..warmup {
            self.post_write(remote, bytes, u64::from(i), i + 1 == warmup)?;
        }
        self.poll(1, &mut wcs)?;

        // Latency matters for small messages; large ones only need a few samples.
        let lat_cap = if bytes >= LARGE_MESSAGE_BYTES {
            10
        } else {
            MAX_LATENCY_ITERS
        };
        let lat_iters = iterations.clamp(1, lat_cap);
        let start = Instant::now();
        for i in 0..lat_iters {
            self.post_write(remote, bytes, u64::from(i), true)?;
            self.poll(1, &mut wcs)?;
        }
        let lat_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(lat_iters);

        // perftest's run_iter_bw: at most tx depth writes outstanding, every cq_mod-th and the
        // last one signaled; a completion's wr_id is the index of the write it finishes.
        let cq_mod = CQ_MOD.min(TX_DEPTH);
        let (mut posted, mut done) = (0u32, 0u32);
        let start = Instant::now();
        while done < iterations {
            while posted < iterations && posted - done < TX_DEPTH {
                let signaled = (posted + 1) % cq_mod == 0 || posted + 1 == iterations;
                self.post_write(remote, bytes, u64::from(posted), signaled)?;
                posted += 1;
            }
            let n = self.poll(1, &mut wcs)?;
            let last = wcs[..n].iter().map(|wc| wc.wr_id()).max().unwrap_or(0);
            done = done.max(u32::try_from(last).unwrap_or(u32::MAX).saturating_add(1));
        }
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        let bw_gbps = bytes as f64 * 8.0 * f64::from(iterations) / secs / 1e9;
        Ok(SizePoint {
            bytes,
            bw_gbps,
            lat_us,
        })
    }
}

/// A wait of the ping-pong: busy polling, as perftest does, then (past [`PURE_SPIN`]) polling
/// that yields the CPU between tries, until the deadline.
struct Spin {
    started: Instant,
    deadline: Instant,
    tries: u32,
    yielding: bool,
}

impl Spin {
    fn new(timeout: Duration) -> Self {
        let started = Instant::now();
        Spin {
            started,
            deadline: started + timeout,
            tries: 0,
            yielding: false,
        }
    }

    /// Call between two polls; false once the deadline has passed.
    fn again(&mut self) -> bool {
        self.tries = self.tries.wrapping_add(1);
        // The clock is read every 64 tries: cheap against a poll, fine-grained against 20 µs.
        if self.tries & 0x3f == 0 {
            let now = Instant::now();
            if now > self.deadline {
                return false;
            }
            self.yielding = self.yielding || now - self.started >= PURE_SPIN;
        }
        if self.yielding {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        true
    }
}

/// Where ping-pong writes land in a buffer of `len` bytes: its second half, apart from the first
/// half they are sent from, as perftest keeps `post_buf` and `poll_buf` apart in one buffer
/// (`run_iter_lat_write`, `src/perftest_resources.c`).
fn pp_rx_offset(len: u64) -> u64 {
    len / 2
}

/// The byte the waiting side polls for in round trip `seq` (from 1): never 0, the value the
/// receive byte starts from, and never the previous round trip's (perftest's `(char)rcnt`).
fn pp_byte(seq: u32) -> u8 {
    ((seq - 1) % 255 + 1) as u8
}

impl VerbsEndpoint {
    /// The host buffer's base pointer; `None` for GPU memory, which the CPU may not touch.
    fn host_ptr(&mut self) -> Option<*mut u8> {
        match &mut self.buf {
            Buffer::Host(v) => Some(v.as_mut_ptr()),
            Buffer::Gpu { .. } => None,
        }
    }

    fn pp_prepare(&mut self, bytes: usize, wait: PingPongWait) -> Result<(), RdmaError> {
        self.pp_sends = 0;
        self.pp_imms.clear();
        match wait {
            PingPongWait::LastByte => {
                let at = pp_rx_offset(self.buf.len() as u64) as usize + bytes - 1;
                let Some(base) = self.host_ptr() else {
                    return Err(RdmaError::InvalidRequest {
                        reason: "a last-byte ping-pong needs host memory".into(),
                    });
                };
                // SAFETY: at < buf.len() (bytes <= len / 2, checked by the caller); nothing is
                // in flight toward this buffer yet; volatile because the HCA writes it later.
                unsafe { ptr::write_volatile(base.add(at), 0) };
            }
            PingPongWait::Immediate => {
                for _ in 0..RX_DEPTH {
                    self.post_recv()?;
                }
            }
        }
        Ok(())
    }

    /// Sends round trip `seq`'s write to `remote`'s receive half, signaled as perftest's are.
    fn pp_post(
        &mut self,
        remote: &QpInfo,
        bytes: usize,
        seq: u32,
        wait: PingPongWait,
        inline: bool,
    ) -> Result<(), RdmaError> {
        let mut flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if inline {
            flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        let imm = match wait {
            PingPongWait::LastByte => {
                let Some(base) = self.host_ptr() else {
                    return Err(RdmaError::InvalidRequest {
                        reason: "a last-byte ping-pong needs host memory".into(),
                    });
                };
                // SAFETY: bytes - 1 < buf.len(); this side's previous write has completed (its
                // completion was polled), so the HCA is not reading the byte we change.
                unsafe { ptr::write_volatile(base.add(bytes - 1), pp_byte(seq)) };
                None
            }
            PingPongWait::Immediate => Some(seq),
        };
        let addr = remote.addr + pp_rx_offset(remote.len);
        self.post(addr, remote.rkey, bytes, u64::from(seq), flags, imm)
    }

    /// Polls the CQ once, sorting what it finds: send completions are counted, receive
    /// completions queue their immediate and give the QP its receive request back.
    fn pp_poll(&mut self) -> Result<bool, RdmaError> {
        let mut wcs = [ffi::ibv_wc::default(); 4];
        let n = self.poll_once(&mut wcs)?;
        for wc in &wcs[..n] {
            if wc.opcode() == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
                self.pp_imms
                    .push_back(wc.imm_data().map_or(0, u32::from_be));
                self.post_recv()?;
            } else {
                self.pp_sends += 1;
            }
        }
        Ok(n > 0)
    }

    fn pp_timeout(&self, what: &str) -> RdmaError {
        RdmaError::Timeout {
            op: format!("ping-pong {what} on {}", self.hca),
            after_ms: self.timeout.as_millis() as u64,
        }
    }

    /// Waits for the completion of this side's last ping-pong write (perftest's `ccnt`).
    fn pp_reap(&mut self) -> Result<(), RdmaError> {
        let mut spin = Spin::new(self.timeout);
        loop {
            if self.pp_sends > 0 {
                self.pp_sends -= 1;
                return Ok(());
            }
            if !self.pp_poll()? && !spin.again() {
                return Err(self.pp_timeout("write completion"));
            }
        }
    }

    /// Waits for round trip `seq`'s write from the other side: its last byte in our receive
    /// half (`while (*poll_buf != (char)rcnt)`), or its immediate.
    fn pp_wait(&mut self, bytes: usize, seq: u32, wait: PingPongWait) -> Result<(), RdmaError> {
        let mut spin = Spin::new(self.timeout);
        match wait {
            PingPongWait::LastByte => {
                let at = pp_rx_offset(self.buf.len() as u64) as usize + bytes - 1;
                let Some(base) = self.host_ptr() else {
                    return Err(RdmaError::InvalidRequest {
                        reason: "a last-byte ping-pong needs host memory".into(),
                    });
                };
                let want = pp_byte(seq);
                loop {
                    // SAFETY: at < buf.len(); volatile, because the HCA writes the byte behind
                    // the compiler's back.
                    if unsafe { ptr::read_volatile(base.add(at)) } == want {
                        return Ok(());
                    }
                    if !spin.again() {
                        return Err(self.pp_timeout("write arrival"));
                    }
                }
            }
            PingPongWait::Immediate => loop {
                if let Some(imm) = self.pp_imms.pop_front() {
                    if imm != seq {
                        // Writes complete in order on RC: another immediate is a lost write.
                        return Err(RdmaError::DataMismatch {
                            hca: self.hca.clone(),
                            port: self.port,
                            wrong: 4,
                            bytes: 4,
                        });
                    }
                    return Ok(());
                }
                if !self.pp_poll()? && !spin.again() {
                    return Err(self.pp_timeout("write arrival"));
                }
            },
        }
    }

    /// The `bytes` bytes at `offset` of a host buffer.
    fn host_range(&self, offset: usize, bytes: usize) -> Option<Vec<u8>> {
        match &self.buf {
            Buffer::Host(v) => v.get(offset..offset + bytes).map(<[u8]>::to_vec),
            Buffer::Gpu { .. } => None,
        }
    }
}

/// `ib_write_lat` between two endpoints of this process: `a` posts first (perftest's client),
/// `b` answers. One thread plays both sides in the order two processes would interleave: each
/// side waits for the other's write, posts its own, and polls its completion while the other
/// side works (`run_iter_lat_write`, `src/perftest_resources.c`), so no completion poll sits
/// between a write's arrival and the answer to it.
fn pingpong_pair(
    a: &mut VerbsEndpoint,
    b: &mut VerbsEndpoint,
    bytes: usize,
    iterations: u32,
) -> Result<PingPongLatency, RdmaError> {
    if !a.connected || !b.connected {
        return Err(RdmaError::InvalidRequest {
            reason: "ping-pong before connect".into(),
        });
    }
    if iterations < 2 {
        return Err(RdmaError::InvalidRequest {
            reason: format!("a ping-pong needs at least 2 round trips, not {iterations}"),
        });
    }
    for ep in [&*a, &*b] {
        if bytes == 0 || bytes as u64 > pp_rx_offset(ep.buf.len() as u64) {
            return Err(RdmaError::InvalidRequest {
                reason: format!(
                    "a ping-pong of {bytes} bytes does not fit half of a {}-byte buffer",
                    ep.buf.len()
                ),
            });
        }
    }
    let (a_info, b_info) = (a.info(), b.info());
    let host = a.host_ptr().is_some() && b.host_ptr().is_some();
    let wait = if host {
        PingPongWait::LastByte
    } else {
        PingPongWait::Immediate
    };
    // perftest inlines up to the QP's cap, and never device memory.
    let inline = host && bytes as u64 <= u64::from(a.inline_cap.min(b.inline_cap));
    a.pp_prepare(bytes, wait)?;
    b.pp_prepare(bytes, wait)?;
    let mut posted_us = Vec::with_capacity(iterations as usize);
    let mut delivered = 0u32;
    let t0 = Instant::now();
    for seq in 1..=iterations {
        // perftest's tposted[scnt]: taken just before the post.
        posted_us.push(t0.elapsed().as_secs_f64() * 1e6);
        a.pp_post(&b_info, bytes, seq, wait, inline)?;
        if seq > 1 {
            b.pp_reap()?;
        }
        b.pp_wait(bytes, seq, wait)?;
        delivered += 1;
        b.pp_post(&a_info, bytes, seq, wait, inline)?;
        a.pp_reap()?;
        a.pp_wait(bytes, seq, wait)?;
        delivered += 1;
    }
    b.pp_reap()?;
    if host {
        // The polled byte proves the last byte landed; the whole message must have.
        let rx = |ep: &VerbsEndpoint| pp_rx_offset(ep.buf.len() as u64) as usize;
        for (from, to) in [(&*a, &*b), (&*b, &*a)] {
            if let (Some(src), Some(dst)) =
                (from.host_range(0, bytes), to.host_range(rx(to), bytes))
            {
                let wrong = super::differing_bytes(&src, &dst);
                if wrong > 0 {
                    return Err(RdmaError::DataMismatch {
                        hca: to.hca.clone(),
                        port: to.port,
                        wrong,
                        bytes,
                    });
                }
            }
        }
    }
    let stats = half_round_trips(&posted_us).ok_or_else(|| RdmaError::InvalidRequest {
        reason: "a ping-pong needs at least 2 round trips".into(),
    })?;
    Ok(PingPongLatency {
        bytes,
        iterations,
        samples: stats.samples,
        typical_us: stats.typical_us,
        min_us: stats.min_us,
        avg_us: stats.avg_us,
        max_us: stats.max_us,
        inline,
        wait,
        delivered,
    })
}

/// The GID the test runs on: `wanted`, else the one NCCL would use on this port
/// ([`crate::discover::gid`]: on RoCE NCCL's `ncclIbGetGidIndex` over the whole table, the
/// RoCE version of each slot read from sysfs as NCCL reads it; on InfiniBand index 0, or 1
/// when that GID carries a routable FLID, as NCCL's `NCCL_IB_ROUTABLE_FLID_GID_INDEX`).
fn choose_gid(
    ctx: &Context,
    hca: &str,
    port: u8,
    ethernet: bool,
    table_len: c_int,
    wanted: Option<u32>,
) -> Result<(u32, [u8; 16]), RdmaError> {
    use crate::discover::gid::{nccl_roce_gid_index, roce_version_of_type, GidSlot};
    let query = |index: c_int| -> Result<[u8; 16], RdmaError> {
        let mut gid = ffi::ibv_gid::default();
        // SAFETY: ctx is open; gid is a valid out-pointer.
        let rc = unsafe { ffi::ibv_query_gid(ctx.0, port, index, &mut gid) };
        if rc != 0 {
            return Err(verbs_err("ibv_query_gid", rc));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(unsafe { gid.raw })
    };
    if let Some(index) = wanted {
        if index as c_int >= table_len {
            return Err(RdmaError::InvalidRequest {
                reason: format!("gid index {index} is beyond the table of {table_len}"),
            });
        }
        return Ok((index, query(index as c_int)?));
    }
    if !ethernet {
        // The FLID is bytes 4-5 of the GID (NCCL's ncclIbExtractFlid).
        if table_len > 1 {
            if let Ok(gid) = query(1) {
                if gid[4..6] != [0, 0] {
                    return Ok((1, gid));
                }
            }
        }
        return Ok((0, query(0)?));
    }
    let types = format!("/sys/class/infiniband/{hca}/ports/{port}/gid_attrs/types");
    let table: Vec<GidSlot> = (0..table_len.clamp(0, 256))
        .map(|index| match query(index) {
            Ok(gid) => GidSlot {
                gid,
                roce_version: std::fs::read_to_string(format!("{types}/{index}"))
                    .ok()
                    .and_then(|t| roce_version_of_type(&t)),
            },
            // A slot the device will not answer is as good as unused.
            Err(_) => GidSlot::UNUSED,
        })
        .collect();
    let index = nccl_roce_gid_index(&table).unwrap_or(0);
    let gid = table.get(index as usize).map_or([0u8; 16], |slot| slot.gid);
    Ok((index, gid))
}

fn parse_gid(s: &str) -> Result<[u8; 16], RdmaError> {
    let bytes = hex::decode(s).map_err(|_| RdmaError::InvalidRequest {
        reason: format!("gid {s:?} is not hex"),
    })?;
    bytes.try_into().map_err(|_| RdmaError::InvalidRequest {
        reason: format!("gid {s:?} is not 16 bytes"),
    })
}

impl RdmaEndpoint for VerbsEndpoint {
    fn info(&self) -> QpInfo {
        let (_, rkey) = self.keys();
        QpInfo {
            hca: self.hca.clone(),
            port: self.port,
            qpn: self.qp_num(),
            psn: self.psn,
            lid: self.lid,
            gid: hex::encode(self.gid),
            gid_index: self.gid_index,
            rkey,
            addr: self.buf.addr(),
            len: self.buf.len() as u64,
            mtu: self.active_mtu,
            sim: None,
        }
    }

    fn host_bytes(&self, len: usize) -> Option<Vec<u8>> {
        self.host_range(0, len)
    }

    fn pingpong(
        &mut self,
        partner: &mut dyn RdmaEndpoint,
        bytes: usize,
        iterations: u32,
    ) -> Result<PingPongLatency, RdmaError> {
        let partner: &mut dyn std::any::Any = partner;
        let Some(partner) = partner.downcast_mut::<VerbsEndpoint>() else {
            return Err(RdmaError::InvalidRequest {
                reason: "a verbs endpoint can only ping-pong with another verbs endpoint".into(),
            });
        };
        pingpong_pair(self, partner, bytes, iterations)
    }

    fn registration(&self) -> Option<GpuRegistrationReport> {
        match &self.buf {
            Buffer::Host(_) => None,
            Buffer::Gpu { report, .. } => Some(report.clone()),
        }
    }

    fn connect(&mut self, remote: &QpInfo, class: TrafficClass) -> Result<(), RdmaError> {
        if !(ffi::IBV_MTU_256..=ffi::IBV_MTU_4096).contains(&remote.mtu) {
            return Err(RdmaError::InvalidRequest {
                reason: format!("remote path MTU code {} is not 1..=5", remote.mtu),
            });
        }
        let dgid = parse_gid(&remote.gid)?;
        let global = self.ethernet || remote.lid == 0 || self.lid == 0;
        let mut ah = ffi::ibv_ah_attr {
            dlid: remote.lid,
            sl: class.service_level,
            src_path_bits: 0,
            port_num: self.port as u8,
            is_global: u8::from(global),
            ..Default::default()
        };
        if global {
            ah.grh.dgid.raw = dgid;
            ah.grh.sgid_index = self.gid_index as u8;
            ah.grh.hop_limit = 64;
            ah.grh.traffic_class = class.traffic_class;
        }
        let mut rtr = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: self.active_mtu.min(remote.mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_AV
            | ffi::ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ffi::ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ffi::ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ffi::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: qp is live in INIT; attr/mask describe INIT->RTR.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.0, &mut rtr, mask.0 as c_int) };
        if rc != 0 {
            return Err(verbs_err("ibv_modify_qp(RTR)", rc));
        }
        let mut rts = ffi::ibv_qp_attr {
            qp_state: ffi::ibv_qp_state::IBV_QPS_RTS,
            sq_psn: self.psn,
            timeout: ACK_TIMEOUT,
            retry_cnt: RETRY_CNT,
            rnr_retry: 7,
            max_rd_atomic: 1,
            ..Default::default()
        };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_STATE
            | ffi::ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ffi::ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ffi::ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ffi::ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: qp is live in RTR; attr/mask describe RTR->RTS.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.0, &mut rts, mask.0 as c_int) };
        if rc != 0 {
            return Err(verbs_err("ibv_modify_qp(RTS)", rc));
        }
        self.connected = true;
        Ok(())
    }

    fn write_sweep(
        &mut self,
        remote: &QpInfo,
        sizes: &[usize],
        iterations: u32,
    ) -> Result<Vec<SizePoint>, RdmaError> {
        if !self.connected {
            return Err(RdmaError::InvalidRequest {
                reason: "write_sweep before connect".into(),
            });
        }
        if iterations == 0 {
            return Err(RdmaError::InvalidRequest {
                reason: "iterations must be at least 1".into(),
            });
        }
        let mut points = Vec::with_capacity(sizes.len());
        for &bytes in sizes {
            if bytes == 0 || bytes > self.buf.len() || bytes as u64 > remote.len {
                return Err(RdmaError::InvalidRequest {
                    reason: format!(
                        "message of {bytes} bytes does not fit the buffers ({} local, {} remote)",
                        self.buf.len(),
                        remote.len
                    ),
                });
            }
            points.push(self.measure(remote, bytes, iterations)?);
        }
        Ok(points)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine has no RDMA stack: the real engine must say so cleanly (the VM test in
    /// tests/rdma_vm.rs covers the machine that has one).
    #[test]
    fn without_rdma_devices_the_engine_reports_no_devices() {
        if std::path::Path::new("/sys/class/infiniband")
            .read_dir()
            .is_ok_and(|mut d| d.next().is_some())
        {
            return; // A host with real devices; nothing to assert here.
        }
        let engine = VerbsEngine::new();
        assert!(matches!(engine.devices(), Err(RdmaError::NoDevices)));
        let err = engine
            .loopback(&RailBenchRequest::host("mlx5_0", 1))
            .unwrap_err();
        assert_eq!(err.to_string(), "no RDMA devices");
    }

    #[test]
    fn gid_parsing() {
        let g = parse_gid("00000000000000000000ffff0a000202").unwrap();
        assert_eq!(&g[12..], &[10, 0, 2, 2]);
        assert!(parse_gid("zz").is_err());
        assert!(parse_gid("0011").is_err());
    }
}
