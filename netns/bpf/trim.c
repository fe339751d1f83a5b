// SPDX-License-Identifier: GPL-2.0
/*
 * mrcstack: packet trimming and ECN marking on a switch port, like an MRC switch.
 *
 * A tc BPF program (clsact egress, direct action) for a switch namespace's port.  The kernel
 * it runs on has no AQM qdisc, so the program models the port's queue itself: a virtual
 * queue drained at the port's shaped rate (the same rate as the htb shaper behind it).
 * Per packet:
 *
 *   backlog -= elapsed * rate                (clamped at 0)
 *   MRC data packet in the trimmable class (DSCP 4) and backlog + len > trim threshold
 *   (or the random draw hits):
 *       cut it to its headers (68/72 bytes of UDP payload), set TRIMMED (+ TRIM_LASTHOP on
 *       a host-facing port), remark it DSCP 12 (trimmed), account the trimmed size, and
 *       send it through the port's egress once more (so htb charges the cut length) in the
 *       priority class
 *   else backlog > ECN threshold, port not last hop, packet ECT(0)/ECT(1): set CE
 *   backlog += len                           (unless the modelled queue is full)
 *
 * docs/trimming.md describes the model, the byte offsets and the approximations.  The
 * layout of the three maps below is mirrored by netns/trim.py (struct formats there): keep
 * them in step.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ROCEV2_PORT 4791
/* OCP MRC 1.0 writes: FIRST 0xC6 .. ONLY_IMM 0xCB; LAST_IMM and ONLY_IMM carry an ImmDt. */
#define OP_WRITE_FIRST 0xC6
#define OP_WRITE_LAST_IMM 0xC9
#define OP_WRITE_ONLY_IMM 0xCB
#define BTH_LEN 12
#define BTH_FLAGS_OFF 8 /* A, R, RTX, TS */
#define BTH_TS 0x10     /* a TSETH follows the METH (mrcstack always sends one) */
#define METH_LEN 4
#define TSETH_LEN 4
#define RETH_LEN 16
#define IMMDT_LEN 4
#define XETH_LEN 32       /* mrcstack's extension header, last before the payload */
#define XETH_FLAGS_OFF 1  /* its flags byte: the only bits a switch writes */
#define XETH_VERSION 4
#define FLAG_TRIMMED 0x40
#define FLAG_TRIM_LASTHOP 0x80
#define DATA_HDR_LEN (BTH_LEN + METH_LEN + TSETH_LEN + RETH_LEN + XETH_LEN) /* 68 */
#define DATA_IMM_HDR_LEN (DATA_HDR_LEN + IMMDT_LEN)                         /* 72 */
#define L3_OFF ETH_HLEN                                     /* 14 */
#define L4_OFF (L3_OFF + (int)sizeof(struct ipv6hdr))       /* 54 */
#define MRC_OFF (L4_OFF + (int)sizeof(struct udphdr))       /* 62 */
/* Traffic classes (DSCP) of OCP MRC 1.0: only the trimmable class is ever trimmed. */
#define DSCP_DATA 4      /* trimmable data */
#define DSCP_TRIMMED 12  /* a trimmed header: forwarded ahead of data */
#define DSCP_CONTROL 46  /* ACK/SACK/NACK/probes */
#define ECN_MASK 0x30 /* ECN bits of the traffic class, in the IPv6 header's second byte */
#define ECN_CE 0x30
#define NSEC_PER_SEC 1000000000ULL
/* skb->tc_index of a trimmed packet sent through the port's egress once more (see below). */
#define REQUEUE_TAG 0x7472

enum trim_mode {
	MODE_OFF = 0,         /* count packets, touch nothing, model nothing */
	MODE_CONGESTION = 1,  /* trim above the trim threshold of the virtual queue */
	MODE_PROBABILITY = 2, /* trim data packets with a fixed probability (fault injection) */
};

#define CFG_LAST_HOP 0x1 /* the port faces a host: TRIM_LASTHOP, never ECN */
#define CFG_ECN_ANY 0x2  /* ECN-mark any ECT IPv6 packet, not only MRC's */

/* Written by userspace (netns/trim.py), read by the program.  All zero = MODE_OFF. */
struct trim_cfg {
	__u64 rate;          /* bytes per second drained from the virtual queue; 0 = no queue */
	__u64 rate_bits;     /* the shaper's rate in bit/s, as configured (userspace only) */
	__u64 trim_thresh;   /* bytes of backlog above which MRC data packets are trimmed */
	__u64 ecn_thresh;    /* bytes of backlog above which ECT packets get CE */
	__u64 queue_limit;   /* bytes the real queue holds (0 = unlimited): above, not counted */
	__u64 probability;   /* MODE_PROBABILITY: trim if prandom_u32 < probability (2^32 = all) */
	__u32 mode;          /* enum trim_mode */
	__u32 flags;         /* CFG_* */
	__u32 prio_class;    /* skb->priority for trimmed packets (htb class id, e.g. 1:10) */
	__u32 pad;
};

/* The virtual queue, shared by every CPU and updated under its lock. */
struct trim_queue {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 backlog;  /* bytes */
	__u64 last_ns;  /* bpf_ktime_get_ns() of the last update */
	__u64 rem;      /* drained byte-nanoseconds not yet worth a whole byte (< 1e9) */
};

/* Per-CPU counters; userspace sums them over the possible CPUs. */
struct trim_stats {
	__u64 packets;     /* every packet seen */
	__u64 bytes;       /* their bytes, as they arrived (Ethernet frame) */
	__u64 trimmed;     /* MRC data packets cut to their headers */
	__u64 ecn_marked;  /* ECT packets marked CE */
	__u64 passed;      /* packets left as they were */
	__u64 mrc_data;    /* MRC data packets (untrimmed on arrival) seen */
	__u64 priority;    /* packets sent in the priority class (trimmed here or upstream) */
	__u64 overlimit;   /* packets the modelled queue had no room for (the real one drops) */
	__u64 trim_errors; /* trims that failed (bpf_skb_change_tail); the packet passed */
	__u64 requeued;    /* trimmed packets re-sent through egress so the shaper sees the cut */
	__u64 class_data;    /* packets arriving in DSCP 4 (trimmable data) */
	__u64 class_control; /* in DSCP 46 (control) */
	__u64 class_trimmed; /* in DSCP 12 (trimmed upstream) */
	__u64 class_other;   /* any other DSCP, or not IPv6 */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct trim_cfg);
} trim_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct trim_queue);
} trim_queue SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct trim_stats);
} trim_stats SEC(".maps");

/* What the parser found: hdr_len is the MRC header length (68/72) of a data packet. */
struct pkt_info {
	__u32 hdr_len;    /* 0 = not an untrimmed MRC data packet */
	int is_trimmed;   /* an MRC data packet some switch upstream already trimmed */
	int is_mrc;       /* UDP to port 4791 over IPv6 */
	int is_ect;       /* ECN field 01 or 10 */
	int dscp;         /* the traffic class's DSCP; -1 if not IPv6 */
};

static __always_inline void parse(struct __sk_buff *skb, struct pkt_info *info)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6;
	struct udphdr *udp;
	__u8 *mrc;
	__u8 opcode, flags, ecn;
	__u32 hlen, udp_len;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IPV6))
		return;
	ip6 = (void *)(eth + 1);
	if ((void *)(ip6 + 1) > data_end)
		return;
	info->dscp = ((((__u8 *)ip6)[0] & 0x0F) << 2) | (((__u8 *)ip6)[1] >> 6);
	ecn = ((__u8 *)ip6)[1] & ECN_MASK;
	info->is_ect = ecn == 0x10 || ecn == 0x20; /* ECT(1), ECT(0) */
	if (ip6->nexthdr != IPPROTO_UDP) /* no extension headers: uSID carries the path */
		return;
	udp = (void *)(ip6 + 1);
	if ((void *)(udp + 1) > data_end || udp->dest != bpf_htons(ROCEV2_PORT))
		return;
	info->is_mrc = 1;
	if (skb->gso_size) /* a GSO super-packet is not one MRC packet: leave it alone */
		return;
	mrc = (void *)(udp + 1);
	if ((void *)(mrc + DATA_HDR_LEN) > data_end)
		return;
	opcode = mrc[0];
	if (opcode < OP_WRITE_FIRST || opcode > OP_WRITE_ONLY_IMM)
		return;
	if (!(mrc[BTH_FLAGS_OFF] & BTH_TS))
		return; /* no TSETH: not a layout mrcstack sends */
	if (opcode == OP_WRITE_LAST_IMM || opcode == OP_WRITE_ONLY_IMM)
		hlen = DATA_IMM_HDR_LEN;
	else
		hlen = DATA_HDR_LEN;
	if ((void *)(mrc + hlen) > data_end)
		return;
	udp_len = bpf_ntohs(udp->len);
	if (udp_len < sizeof(struct udphdr) + hlen ||
	    udp_len != bpf_ntohs(ip6->payload_len) || skb->len != L4_OFF + udp_len)
		return; /* not the layout we trim (padding, jumbo, truncated) */
	if (mrc[hlen - XETH_LEN] != XETH_VERSION)
		return;
	flags = mrc[hlen - XETH_LEN + XETH_FLAGS_OFF];
	if (flags & FLAG_TRIMMED) {
		info->is_trimmed = 1;
		return;
	}
	info->hdr_len = hlen;
}

/* Cut the packet to Ethernet + IPv6 + UDP + MRC headers and mark it.  0 on success. */
static __always_inline int trim(struct __sk_buff *skb, __u32 hlen, __u8 mark)
{
	void *data, *data_end;
	struct ipv6hdr *ip6;
	struct udphdr *udp;
	__u8 *mrc;
	__u16 new_l4 = sizeof(struct udphdr) + hlen;

	if (bpf_skb_change_tail(skb, MRC_OFF + hlen, 0))
		return -1;
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip6 = data + L3_OFF;
	udp = data + L4_OFF;
	mrc = data + MRC_OFF;
	if (hlen == DATA_IMM_HDR_LEN) {
		if ((void *)(mrc + DATA_IMM_HDR_LEN) > data_end)
			return -1;
		mrc[DATA_IMM_HDR_LEN - XETH_LEN + XETH_FLAGS_OFF] |= mark;
	} else {
		if ((void *)(mrc + DATA_HDR_LEN) > data_end)
			return -1;
		mrc[DATA_HDR_LEN - XETH_LEN + XETH_FLAGS_OFF] |= mark;
	}
	ip6->payload_len = bpf_htons(new_l4);
	/* DSCP 12, the trimmed class; version and ECN bits kept (no header checksum in IPv6). */
	((__u8 *)ip6)[0] = 0x60 | (DSCP_TRIMMED >> 2);
	((__u8 *)ip6)[1] = ((DSCP_TRIMMED & 0x3) << 6) | (((__u8 *)ip6)[1] & 0x3F);
	udp->len = bpf_htons(new_l4);
	udp->check = 0; /* zero UDP checksum over IPv6 (UDP_NO_CHECK6_TX/RX), as sent */
	return 0;
}

static __always_inline void set_ce(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *tc_byte = data + L3_OFF + 1;

	if ((void *)(tc_byte + 1) > data_end)
		return;
	*tc_byte |= ECN_CE; /* neither the IPv6 header nor the UDP pseudo-header sum covers it */
}

SEC("tc")
int mrc_trim(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct trim_cfg *cfg = bpf_map_lookup_elem(&trim_cfg, &zero);
	struct trim_queue *q = bpf_map_lookup_elem(&trim_queue, &zero);
	struct trim_stats *st = bpf_map_lookup_elem(&trim_stats, &zero);
	struct pkt_info info = {};
	__u64 now, len, acct, elapsed, secs, drained, backlog, rate, rem;
	__u32 draw, mode;
	int do_trim = 0, do_ce = 0, prio = 0;

	if (!cfg || !q || !st)
		return TC_ACT_OK;
	if (skb->tc_index == REQUEUE_TAG) {
		/* Our own trimmed packet, back from bpf_redirect: already decided and counted. */
		skb->tc_index = 0;
		if (cfg->prio_class)
			skb->priority = cfg->prio_class;
		st->requeued++;
		return TC_ACT_OK;
	}
	len = skb->len;
	st->packets++;
	st->bytes += len;
	/* Make the headers linear (no-op when they already are); fails only on short packets. */
	if ((__u64)((long)skb->data_end - (long)skb->data) < MRC_OFF + DATA_IMM_HDR_LEN)
		bpf_skb_pull_data(skb, MRC_OFF + DATA_IMM_HDR_LEN);
	info.dscp = -1;
	parse(skb, &info);
	if (info.dscp == DSCP_DATA)
		st->class_data++;
	else if (info.dscp == DSCP_CONTROL)
		st->class_control++;
	else if (info.dscp == DSCP_TRIMMED)
		st->class_trimmed++;
	else
		st->class_other++;
	mode = cfg->mode;
	if (mode != MODE_CONGESTION && mode != MODE_PROBABILITY) {
		st->passed++;
		return TC_ACT_OK;
	}
	if (info.dscp != DSCP_DATA)
		info.hdr_len = 0; /* only the trimmable class is ever trimmed */
	now = bpf_ktime_get_ns();
	draw = bpf_get_prandom_u32();
	rate = cfg->rate;

	bpf_spin_lock(&q->lock);
	backlog = q->backlog;
	rem = q->rem;
	if (rate) {
		/* rate <= 1.25e10 B/s (100 Gbit/s, checked by netns/trim.py): frac * rate + rem
		 * stays below 2^64, and secs * rate too for any plausible uptime. */
		elapsed = now > q->last_ns ? now - q->last_ns : 0;
		secs = elapsed / NSEC_PER_SEC;
		rem += (elapsed - secs * NSEC_PER_SEC) * rate;
		drained = secs * rate + rem / NSEC_PER_SEC;
		rem %= NSEC_PER_SEC;
		if (drained >= backlog) {
			backlog = 0;
			rem = 0; /* an idle link banks no credit */
		} else {
			backlog -= drained;
		}
	} else {
		backlog = 0; /* unshaped: no queue ever builds */
	}
	if (info.hdr_len) {
		if (mode == MODE_PROBABILITY)
			do_trim = (__u64)draw < cfg->probability;
		else
			do_trim = backlog + len > cfg->trim_thresh;
	}
	if (!do_trim && info.is_ect && (info.is_mrc || (cfg->flags & CFG_ECN_ANY)) &&
	    !(cfg->flags & CFG_LAST_HOP) && rate && backlog > cfg->ecn_thresh)
		do_ce = 1;
	acct = do_trim ? MRC_OFF + info.hdr_len : len;
	if (rate) {
		if (cfg->queue_limit && backlog + acct > cfg->queue_limit)
			acct = 0; /* the real queue tail-drops it: it never occupies the link */
		q->backlog = backlog + acct;
		if (now > q->last_ns) /* "now" was read before the lock: never step back */
			q->last_ns = now;
		q->rem = rem;
	}
	bpf_spin_unlock(&q->lock);

	if (rate && !acct)
		st->overlimit++;
	if (info.hdr_len)
		st->mrc_data++;
	if (do_trim) {
		__u8 mark = FLAG_TRIMMED | ((cfg->flags & CFG_LAST_HOP) ? FLAG_TRIM_LASTHOP : 0);

		if (trim(skb, info.hdr_len, mark)) {
			st->trim_errors++;
			do_trim = 0;
		} else {
			st->trimmed++;
			if (rate && cfg->prio_class) {
				/* The qdisc layer measured the packet (qdisc_skb_cb pkt_len) before this
				 * hook ran, so htb would charge the untrimmed length.  Sending it through
				 * this port's egress again measures it anew; the tag makes that second
				 * pass a no-op here. */
				skb->tc_index = REQUEUE_TAG;
				st->priority++;
				return bpf_redirect(skb->ifindex, 0);
			}
			prio = 1;
		}
	} else if (do_ce) {
		set_ce(skb);
		st->ecn_marked++;
	}
	if (info.is_trimmed || info.dscp == DSCP_TRIMMED)
		prio = 1;
	if (prio && cfg->prio_class) {
		skb->priority = cfg->prio_class;
		st->priority++;
	}
	if (!do_trim && !do_ce)
		st->passed++;
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
