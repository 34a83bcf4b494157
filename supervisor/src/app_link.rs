//! The SOCK_SEQPACKET socket pair to one incarnation: one message per
//! send/recv, fds as SCM_RIGHTS.  Never blocks.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::proto::{MAX_FDS, MSG_MAX};

/// Room for more fds than the protocol allows, so that an app sending too
/// many is told so instead of having them cut silently.
const CMSG_FDS: usize = 2 * MAX_FDS + 8;

/// (supervisor end, app end), both close-on-exec.
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair writes two fds into our array.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds are fresh and ours.
    let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The app's end must block (the runtime polls before it reads, but the
    // app may be an ordinary program that reads the fd directly).
    // SAFETY: plain fcntl on our fd.
    unsafe {
        let fl = libc::fcntl(b.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(b.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok((a, b))
}

pub enum Recv {
    /// One message (maybe malformed), and the fds that came with it.
    Msg {
        data: Vec<u8>,
        fds: Vec<OwnedFd>,
        truncated: bool,
    },
    /// Nothing more to read now.
    WouldBlock,
    /// Zero bytes: the peer is gone, or sent an empty message.
    Empty,
}

fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure computation.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// What one `recvmsg` brought.
pub struct RawMsg {
    /// Bytes received (at most the buffer's length).
    pub len: usize,
    /// The kernel set MSG_TRUNC or MSG_CTRUNC.
    pub truncated: bool,
    /// Every SCM_RIGHTS fd that arrived, owned (closed when dropped).
    pub fds: Vec<OwnedFd>,
    /// SCM_CREDENTIALS, if any: (pid, uid).
    pub cred: Option<(u32, u32)>,
}

/// One non-blocking `recvmsg` into `buf` with a control buffer of
/// `ctl_words` u64s, MSG_CMSG_CLOEXEC, retried on EINTR; None if nothing
/// is there to read.
pub fn recv_raw(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    ctl_words: usize,
) -> io::Result<Option<RawMsg>> {
    // u64 storage keeps the control buffer aligned for cmsghdr
    let mut ctl = vec![0u64; ctl_words];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is a valid starting value.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl.as_mut_ptr().cast();
    mh.msg_controllen = ctl.len() * 8;
    let n = loop {
        // SAFETY: the msghdr points at live buffers of the given sizes.
        let n = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut mh,
                libc::MSG_CMSG_CLOEXEC | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(e),
            }
        }
        break n as usize;
    };
    let mut fds = Vec::new();
    let mut cred = None;
    // SAFETY: walking the control messages the kernel wrote into ctl, with
    // the libc macros, and taking ownership of each SCM_RIGHTS fd once.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let len = (*c).cmsg_len as usize - (data as usize - c as usize);
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let raw = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    if raw >= 0 {
                        fds.push(OwnedFd::from_raw_fd(raw));
                    }
                }
            } else if (*c).cmsg_level == libc::SOL_SOCKET
                && (*c).cmsg_type == libc::SCM_CREDENTIALS
                && len >= std::mem::size_of::<libc::ucred>()
            {
                let uc: libc::ucred = std::ptr::read_unaligned(data.cast());
                cred = Some((uc.pid as u32, uc.uid));
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    Ok(Some(RawMsg {
        len: n,
        truncated: mh.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
        fds,
        cred,
    }))
}

pub fn recv(fd: BorrowedFd<'_>) -> io::Result<Recv> {
    let mut buf = vec![0u8; MSG_MAX + 1];
    let Some(m) = recv_raw(fd, &mut buf, cmsg_space(CMSG_FDS).div_ceil(8))? else {
        return Ok(Recv::WouldBlock);
    };
    let n = m.len;
    let truncated = m.truncated || n > MSG_MAX;
    if n == 0 && m.fds.is_empty() && !truncated {
        return Ok(Recv::Empty);
    }
    buf.truncate(n.min(MSG_MAX));
    Ok(Recv::Msg {
        data: buf,
        fds: m.fds,
        truncated,
    })
}

/// Sends one message with fds; Ok(false) if the socket is full.
pub fn send(fd: BorrowedFd<'_>, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<bool> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is a valid starting value.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    let mut ctl = vec![0u64; cmsg_space(fds.len().max(1)).div_ceil(8)];
    if !fds.is_empty() {
        mh.msg_control = ctl.as_mut_ptr().cast();
        mh.msg_controllen = cmsg_space(fds.len());
        // SAFETY: ctl is large enough for one cmsghdr with fds.len() ints.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len =
                libc::CMSG_LEN((fds.len() * std::mem::size_of::<RawFd>()) as u32) as usize;
            let data = libc::CMSG_DATA(c) as *mut RawFd;
            for (i, f) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), f.as_raw_fd());
            }
        }
    }
    loop {
        // SAFETY: the msghdr points at live buffers.
        let n =
            unsafe { libc::sendmsg(fd.as_raw_fd(), &mh, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => return Ok(false),
                _ => return Err(e),
            }
        }
        return Ok(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{self, AppMsg, FdEntry, FdKind};
    use std::os::fd::AsFd;

    #[test]
    fn messages_and_fds_cross_the_pair() {
        let (sup, app) = pair().unwrap_or_else(|e| panic!("{e}"));
        let m = AppMsg::Fds(vec![FdEntry {
            kind: FdKind::Manifest,
            name: "manifest".into(),
        }]);
        let bytes = proto::encode_app(&m);
        let (x, _y) = pair().unwrap_or_else(|e| panic!("{e}"));
        assert!(send(app.as_fd(), &bytes, &[x.as_fd()]).unwrap_or(false));
        match recv(sup.as_fd()) {
            Ok(Recv::Msg {
                data,
                fds,
                truncated,
            }) => {
                assert!(!truncated);
                assert_eq!(fds.len(), 1);
                assert_eq!(proto::parse_app(&data, fds.len()), Ok(m));
            }
            _ => panic!("no message"),
        }
        assert!(matches!(recv(sup.as_fd()), Ok(Recv::WouldBlock)));
        // an oversized message is reported as truncated
        let big = vec![0u8; MSG_MAX + 100];
        assert!(send(app.as_fd(), &big, &[]).unwrap_or(false));
        assert!(matches!(
            recv(sup.as_fd()),
            Ok(Recv::Msg {
                truncated: true,
                ..
            })
        ));
        drop(app);
        assert!(matches!(recv(sup.as_fd()), Ok(Recv::Empty)));
    }
}
