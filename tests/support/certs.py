"""Throwaway certificates for the TLS tests: a CA, and server and client certificates it signs (openssl CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(tmp: Path, name: str) -> tuple[Path, Path]:
    key, pem = tmp / f"{name}.key", tmp / f"{name}.pem"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(pem), "-days", "2", "-subj", f"/CN={name}")
    return pem, key


def make_cert(tmp: Path, name: str, ca: tuple[Path, Path],
              san: str = "IP:127.0.0.1,IP:::1,DNS:localhost") -> tuple[Path, Path]:
    key, csr, pem, ext = (tmp / f"{name}.{suffix}" for suffix in ("key", "csr", "pem", "ext"))
    ext.write_text(f"subjectAltName={san}\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(csr), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
             "-out", str(pem), "-days", "2", "-extfile", str(ext))
    return pem, key
