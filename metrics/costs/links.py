"""Named interconnects and their bandwidth, explicit and overridable. Stdlib only (the UI imports it).

Units: GB = 1e9 bytes; `*_gbps` is GB per second (bytes, not bits).

Which bandwidth: every link here is stored as its **per-direction** bandwidth, the rate at which
one GPU can send while it also receives. A ring collective sends and receives at once, so the time
to move the bytes a rank sends is `sent_bytes / per_direction`. This is also the peak that
nccl-tests' busbw is compared against (H100 NVLink: busbw tops out near 450, not 900).

The chapter (seed/distributed-training-basics.zh.txt, 11.1 and 11.5) quotes:
- NVLink 3.0 (A100) 600 GB/s and NVLink 4.0 (H100) 900 GB/s, both "双向" (bidirectional)
  -> 300 and 450 GB/s per direction.
- PCIe Gen4 x16 "64 GB/s 双向" in its all-reduce example, but "~32 GB/s 双向" in 11.5, and Gen5
  "~64 GB/s 双向". The PCIe spec's x16 figures are ~32 GB/s (Gen4) and ~64 GB/s (Gen5) *per
  direction*; reading the chapter's 32/64 that way is also what reproduces its 0.8 s all-reduce
  (see cost_model.comm_time_s). So pcie4 = 32 and pcie5 = 64 GB/s per direction (64 / 128 both ways).
- HDR InfiniBand 200 Gb/s = 25 GB/s, NDR 400 Gb/s = 50 GB/s. InfiniBand rates are per direction
  per port, so these are taken as per-direction figures as they stand.

A plain number given by the user (`--link 123`) is read as GB/s per direction.
"""

from __future__ import annotations

from dataclasses import dataclass

from ringtop.metrics.units import GB


@dataclass(frozen=True, slots=True)
class Link:
    """One interconnect. `per_direction_gbps` is what time estimates divide by."""

    name: str
    per_direction_gbps: float
    description: str = ""

    @property
    def bidirectional_gbps(self) -> float:
        """Both directions together: the figure vendors (and the chapter) usually quote."""
        return 2.0 * self.per_direction_gbps

    @property
    def per_direction_bytes_per_s(self) -> float:
        return self.per_direction_gbps * GB


LINKS: dict[str, Link] = {
    "nvlink3": Link("nvlink3", 300.0, "NVLink 3.0 (A100), 600 GB/s bidirectional"),
    "nvlink4": Link("nvlink4", 450.0, "NVLink 4.0 (H100), 900 GB/s bidirectional"),
    "pcie4": Link("pcie4", 32.0, "PCIe Gen4 x16, ~32 GB/s per direction (64 GB/s bidirectional)"),
    "pcie5": Link("pcie5", 64.0, "PCIe Gen5 x16, ~64 GB/s per direction (128 GB/s bidirectional)"),
    "ib-hdr": Link("ib-hdr", 25.0, "HDR InfiniBand, 200 Gb/s = 25 GB/s per direction"),
    "ib-ndr": Link("ib-ndr", 50.0, "NDR InfiniBand, 400 Gb/s = 50 GB/s per direction"),
}


def parse_link(text: str) -> Link:
    """A link by name (see LINKS) or a positive number of GB/s per direction; ValueError otherwise."""
    key = text.strip().lower()
    if key in LINKS:
        return LINKS[key]
    number = key.removesuffix("gb/s").removesuffix("gbps").strip()
    try:
        gbps = float(number)
    except ValueError:
        raise ValueError(f"unknown link {text!r}: use one of {', '.join(LINKS)} "
                         f"or a bandwidth in GB/s per direction (e.g. 123)") from None
    if not gbps > 0 or gbps == float("inf"):
        raise ValueError(f"link bandwidth must be a positive finite number of GB/s, got {text!r}")
    return Link(f"{gbps:g} GB/s", gbps, f"user-given, {gbps:g} GB/s per direction")
