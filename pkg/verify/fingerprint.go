package verify

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/consul-cni-repair/consul-cni-repair/pkg/redirect"
)

// Fingerprint is a cheap summary of a namespace's packet-filter state: it
// changes whenever rules change, so a sandbox is inspected again only then.
//   - Inode identifies the namespace itself (a path bound anew to another
//     namespace is another namespace).
//   - Gen is nf_tables' generation in the namespace: the kernel increments
//     it on every committed transaction, so any change to our table inet
//     consul_tproxy or to iptables-nft's tables moves it.
//   - Legacy4 and Legacy6 are the x_tables nat tables' entry count and
//     size (getsockopt IPT_SO_GET_INFO), read only when the table exists
//     (asking for a missing table would make the kernel create it).
//     Removing or adding a rule changes them; a same-size replacement does
//     not, which the periodic resync covers.
type Fingerprint struct {
	Inode            uint64
	Gen              uint32
	Legacy4, Legacy6 [2]uint32
}

// ReadFingerprint reads a namespace's fingerprint from a thread switched
// into it: no tool runs, three or four system calls.
func ReadFingerprint(netns string) (Fingerprint, error) {
	var fp Fingerprint
	err := redirect.InNetns(netns, func() error {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			return err
		}
		fp.Inode = st.Ino
		gen, err := nftGen()
		if err != nil {
			return err
		}
		fp.Gen = gen
		if hasTable("/proc/thread-self/net/ip_tables_names") {
			fp.Legacy4, err = xtInfo(unix.AF_INET, unix.IPPROTO_IP)
			if err != nil {
				return err
			}
		}
		if hasTable("/proc/thread-self/net/ip6_tables_names") {
			fp.Legacy6, err = xtInfo(unix.AF_INET6, unix.IPPROTO_IPV6)
		}
		return err
	})
	return fp, err
}

// nftGen asks nf_tables for the namespace's generation (NFT_MSG_GETGEN).
// A kernel without nf_tables has generation 0.
func nftGen() (uint32, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return 0, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("netlink bind: %w", err)
	}
	req := make([]byte, unix.NLMSG_HDRLEN+4)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], uint16(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETGEN))
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], 1)
	req[16] = unix.AF_UNSPEC // nfgenmsg: family, version, res_id
	req[17] = unix.NFNETLINK_V0
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("netlink receive: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, fmt.Errorf("netlink: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type == syscall.NLMSG_ERROR {
			return 0, nil
		}
		if len(m.Data) < 4 {
			continue
		}
		for b := m.Data[4:]; len(b) >= 4; {
			l := int(binary.NativeEndian.Uint16(b[0:]))
			typ := binary.NativeEndian.Uint16(b[2:]) &^ unix.NLA_F_NESTED
			if l < 4 || l > len(b) {
				break
			}
			if typ == unix.NFTA_GEN_ID && l >= 8 {
				return binary.BigEndian.Uint32(b[4:8]), nil
			}
			b = b[(l+3)&^3:]
		}
	}
	return 0, fmt.Errorf("netlink: no NFTA_GEN_ID in the answer to NFT_MSG_GETGEN")
}

func hasTable(path string) bool {
	b, err := readProc(path)
	if err != nil {
		return false
	}
	for _, f := range bytes.Fields(b) {
		if string(f) == redirect.Table {
			return true
		}
	}
	return false
}

func readProc(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 512)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// xtGetInfo is struct ipt_getinfo (and ip6t_getinfo, the same layout).
type xtGetInfo struct {
	Name       [32]byte
	ValidHooks uint32
	HookEntry  [5]uint32
	Underflow  [5]uint32
	NumEntries uint32
	Size       uint32
}

// soGetInfo is IPT_SO_GET_INFO and IP6T_SO_GET_INFO.
const soGetInfo = 64

// xtInfo returns the legacy nat table's entry count and size.
func xtInfo(family, level int) ([2]uint32, error) {
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return [2]uint32{}, fmt.Errorf("raw socket: %w", err)
	}
	defer unix.Close(fd)
	var info xtGetInfo
	copy(info.Name[:], redirect.Table)
	l := uint32(unsafe.Sizeof(info))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), soGetInfo,
		uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		if errno == unix.ENOENT {
			return [2]uint32{}, nil
		}
		return [2]uint32{}, fmt.Errorf("getsockopt SO_GET_INFO nat: %w", errno)
	}
	return [2]uint32{info.NumEntries, info.Size}, nil
}
