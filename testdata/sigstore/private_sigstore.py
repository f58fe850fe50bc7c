#!/usr/bin/env python3
"""A private Sigstore for the keyless tests, written independently of the project.

It plays Fulcio (a root and an intermediate CA, P-384, issuing 10-minute P-256 leaves with the
signer's identity and OIDC issuer), a CT log (a P-256 key signing the embedded precertificate
SCT) and Rekor (a P-256 key signing the Merkle tree's checkpoint and each entry's signed entry
timestamp), and writes what cosign 3 and cosign 2 keyless would attach to an image: bundles
v0.3 (DSSE or message signature) and legacy simple-signing annotations. A second, untrusted
set of the same keys lives in DIR/other/ for the forged cases.

Uses `cryptography` and `rfc8785` only. Byte layouts follow RFC 6962 (SCT, Merkle tree), the
DSSE protocol (PAE), Rekor's signed note and SET, and Sigstore's protobuf JSON
(docs/reference: shared sigstore-bundles.md sections 4, 5, 7 and 10).

    init DIR
    sign DIR --digest sha256:HEX --format dsse|message|legacy --identity ID --issuer ISS
         [--reference REGISTRY/REPO] [--case CASE] --out OUT
    sign-all DIR --digest sha256:HEX --identity ID --issuer ISS [--reference R] --out OUTDIR
         (OUTDIR/<format>-<case>.json for every format and case that applies to it)
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import datetime
import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path

import rfc8785
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import Prehashed
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

BUNDLE_V03 = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_V01 = "application/vnd.dev.sigstore.bundle+json;version=0.1"
TRUSTED_ROOT = "application/vnd.dev.sigstore.trustedroot+json;version=0.1"
TRUST_CONFIG = "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json"
SIGNING_CONFIG = "application/vnd.dev.sigstore.signingconfig.v0.2+json"
IN_TOTO = "application/vnd.in-toto+json"
STATEMENT = "https://in-toto.io/Statement/v1"
SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
ISSUER_V1 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
ISSUER_V2 = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
SCT_LIST = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.4.2")
CHECKPOINT_ORIGIN = "rekor.local - 1234567890"
# The trusted keys and CAs are valid from this long before "now" (every case's times lie after).
TRUST_START = 30 * 86400
LEAF_LIFETIME = 600
DAY = 86400


# --- small encodings ---------------------------------------------------------------------------


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def spki(key) -> bytes:
    """DER SubjectPublicKeyInfo of a public (or a private key's public) key."""
    if hasattr(key, "public_key"):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(key) -> bytes:
    """A log's id in Sigstore and RFC 6962: SHA-256 of its DER SubjectPublicKeyInfo."""
    return sha256(spki(key))


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(seconds), tz=datetime.timezone.utc)


def rfc3339(seconds: float) -> str:
    return utc(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def ecdsa(key, data: bytes) -> bytes:
    """DER ECDSA-SHA256 signature of `data`."""
    return key.sign(data, ec.ECDSA(hashes.SHA256()))


# --- the authorities (Fulcio, CT log, Rekor) -----------------------------------------------------


@dataclasses.dataclass
class Authority:
    """One Sigstore instance's private keys: the trusted one in DIR, the untrusted in DIR/other."""

    root_key: ec.EllipticCurvePrivateKey
    root: x509.Certificate
    intermediate_key: ec.EllipticCurvePrivateKey
    intermediate: x509.Certificate
    ct_key: ec.EllipticCurvePrivateKey
    rekor_key: ec.EllipticCurvePrivateKey

    KEYS = ("root_key", "intermediate_key", "ct_key", "rekor_key")
    CERTS = ("root", "intermediate")

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        for name in self.KEYS:
            data = getattr(self, name).private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            (directory / f"{name}.pem").write_bytes(data)
        for name in self.CERTS:
            (directory / f"{name}.crt").write_bytes(pem(getattr(self, name)))

    @classmethod
    def load(cls, directory: Path) -> Authority:
        fields = {}
        for name in cls.KEYS:
            data = (directory / f"{name}.pem").read_bytes()
            fields[name] = serialization.load_pem_private_key(data, password=None)
        for name in cls.CERTS:
            fields[name] = x509.load_pem_x509_certificate((directory / f"{name}.crt").read_bytes())
        return cls(**fields)


def ca_certificate(name: str, key, issuer_name: str, issuer_key, now: float, intermediate: bool):
    """A Fulcio-like CA certificate: the root self-signed, the intermediate pathlen 0 + codeSigning."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "private-sigstore"),
                                 x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "private-sigstore"),
                                x509.NameAttribute(NameOID.COMMON_NAME, issuer_name)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(utc(now - TRUST_START))
        .not_valid_after(utc(now + 3650 * DAY))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0 if intermediate else 1), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=True,
                          crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                       critical=False)
    )
    if intermediate:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA384())


def new_authority(label: str, now: float) -> Authority:
    root_key = ec.generate_private_key(ec.SECP384R1())
    intermediate_key = ec.generate_private_key(ec.SECP384R1())
    root_name, intermediate_name = f"{label} root", f"{label} intermediate"
    root = ca_certificate(root_name, root_key, root_name, root_key, now, intermediate=False)
    intermediate = ca_certificate(intermediate_name, intermediate_key, root_name, root_key, now,
                                  intermediate=True)
    return Authority(root_key, root, intermediate_key, intermediate,
                     ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1()))


def log_json(base_url: str, key, now: float) -> dict:
    return {
        "baseUrl": base_url,
        "hashAlgorithm": "SHA2_256",
        "publicKey": {
            "rawBytes": b64(spki(key)),
            "keyDetails": "PKIX_ECDSA_P256_SHA_256",
            "validFor": {"start": rfc3339(now - TRUST_START)},
        },
        "logId": {"keyId": b64(key_id(key))},
    }


def trusted_root(authority: Authority, now: float) -> dict:
    """Sigstore's trusted_root.json (v0.1, the version the Go and Python clients accept)."""
    der = lambda cert: {"rawBytes": b64(cert.public_bytes(serialization.Encoding.DER))}
    return {
        "mediaType": TRUSTED_ROOT,
        "tlogs": [log_json("https://rekor.local", authority.rekor_key, now)],
        "certificateAuthorities": [{
            "subject": {"organization": "private-sigstore", "commonName": "private-sigstore"},
            "uri": "https://fulcio.local",
            "certChain": {"certificates": [der(authority.intermediate), der(authority.root)]},
            "validFor": {"start": rfc3339(now - TRUST_START)},
        }],
        "ctlogs": [log_json("https://ctfe.local", authority.ct_key, now)],
        "timestampAuthorities": [],
    }


def trust_config(root: dict) -> dict:
    """The ClientTrustConfig wrapping `root`, for `sigstore --trust-config` (no TUF, no URLs)."""
    return {
        "mediaType": TRUST_CONFIG,
        "trustedRoot": root,
        "signingConfig": {
            "mediaType": SIGNING_CONFIG, "caUrls": [], "oidcUrls": [], "rekorTlogUrls": [],
            "tsaUrls": [], "rekorTlogConfig": {"selector": "ANY"}, "tsaConfig": {"selector": "ANY"},
        },
    }


def init(directory: Path) -> None:
    now = time.time()
    for where, label in ((directory, "trusted"), (directory / "other", "untrusted")):
        authority = new_authority(label, now)
        authority.save(where)
        root = trusted_root(authority, now)
        (where / "trusted_root.json").write_text(json.dumps(root, indent=2))
        (where / "trust_config.json").write_text(json.dumps(trust_config(root), indent=2))


# --- the leaf certificate with its embedded SCT --------------------------------------------------


def identity_name(identity: str) -> x509.GeneralName:
    if "://" in identity:
        return x509.UniformResourceIdentifier(identity)
    return x509.RFC822Name(identity)


def leaf_builder(key, ca: Authority, identity: str, issuer: str, not_before: float, serial: int):
    issuer_bytes = issuer.encode()
    assert len(issuer_bytes) < 128, "the .1.8 extension is written with a short-form length"
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(ca.intermediate.subject)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(utc(not_before))
        .not_valid_after(utc(not_before + LEAF_LIFETIME))
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False, key_cert_sign=False,
                          crl_sign=False, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.intermediate_key.public_key()),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName([identity_name(identity)]), critical=True)
        .add_extension(x509.UnrecognizedExtension(ISSUER_V1, issuer_bytes), critical=False)
        .add_extension(
            x509.UnrecognizedExtension(ISSUER_V2, bytes([0x0C, len(issuer_bytes)]) + issuer_bytes),
            critical=False,
        )
    )


def sct_list(tbs: bytes, issuer: x509.Certificate, ct_key, timestamp_ms: int) -> bytes:
    """RFC 6962 §3.2-3.3: one precertificate SCT over `tbs`, as the extension's TLS list."""
    signed = (
        struct.pack(">BBQH", 0, 0, timestamp_ms, 1)
        + key_id(issuer.public_key())
        + struct.pack(">I", len(tbs))[1:]
        + tbs
        + struct.pack(">H", 0)
    )
    signature = ecdsa(ct_key, signed)
    sct = (
        bytes([0])
        + key_id(ct_key)
        + struct.pack(">QH", timestamp_ms, 0)
        + bytes([4, 3])
        + struct.pack(">H", len(signature))
        + signature
    )
    listed = struct.pack(">H", len(sct)) + sct
    return struct.pack(">H", len(listed)) + listed


def der_octet_string(data: bytes) -> bytes:
    n = len(data)
    if n < 128:
        length = bytes([n])
    else:
        size = n.to_bytes((n.bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(size)]) + size
    return b"\x04" + length + data


def leaf_certificate(key, ca: Authority, ct_key, identity: str, issuer: str, not_before: float):
    """A Fulcio leaf: the precertificate's TBS, its SCT by `ct_key` (None: no SCT), the final cert."""
    serial = x509.random_serial_number()
    builder = leaf_builder(key, ca, identity, issuer, not_before, serial)
    if ct_key is None:
        return builder.sign(ca.intermediate_key, hashes.SHA384())
    tbs = builder.sign(ca.intermediate_key, hashes.SHA384()).tbs_certificate_bytes
    scts = sct_list(tbs, ca.intermediate, ct_key, int(not_before * 1000))
    cert = builder.add_extension(
        x509.UnrecognizedExtension(SCT_LIST, der_octet_string(scts)), critical=False
    ).sign(ca.intermediate_key, hashes.SHA384())
    assert cert.tbs_precertificate_bytes == tbs, "the SCT signs the certificate's own TBS"
    return cert


# --- Rekor: the entry, its tree, checkpoint and SET ----------------------------------------------


def merkle_root_and_path(leaves: list[bytes], index: int) -> tuple[bytes, list[bytes]]:
    """RFC 6962 §2.1: the tree head over leaf hashes, and the audit path of `index` (leaf first)."""
    if len(leaves) == 1:
        return leaves[0], []
    split = 1
    while split * 2 < len(leaves):
        split *= 2
    left, right = leaves[:split], leaves[split:]
    if index < split:
        root, path = merkle_root_and_path(left, index)
        sibling, _ = merkle_root_and_path(right, 0)
    else:
        root, path = merkle_root_and_path(right, index - split)
        sibling, _ = merkle_root_and_path(left, 0)
    pair = (root, sibling) if index < split else (sibling, root)
    return sha256(b"\x01" + pair[0] + pair[1]), path + [sibling]


def checkpoint(rekor_key, size: int, root: bytes) -> str:
    """Rekor v1's signed note: origin, size, root; then `— name b64(hint ‖ sig)`."""
    text = f"{CHECKPOINT_ORIGIN}\n{size}\n{b64(root)}\n"
    signature = ecdsa(rekor_key, text.encode())
    return text + f"\n\u2014 rekor.local {b64(key_id(rekor_key)[:4] + signature)}\n"


@dataclasses.dataclass
class LogEntry:
    body: bytes
    integrated_time: int
    log_index: int
    log_id: bytes
    set: bytes | None
    proof: dict

    def bundle_json(self, kind: str, with_set: bool, with_proof: bool = True) -> dict:
        entry = {
            "logIndex": str(self.log_index),
            "logId": {"keyId": b64(self.log_id)},
            "kindVersion": {"kind": kind, "version": "0.0.1"},
            "integratedTime": str(self.integrated_time),
            "canonicalizedBody": b64(self.body),
        }
        if with_proof:
            entry["inclusionProof"] = self.proof
        if with_set:
            entry["inclusionPromise"] = {"signedEntryTimestamp": b64(self.set)}
        return entry

    def cosign_annotation(self) -> str:
        """cosign 2's `dev.sigstore.cosign/bundle`: the SET and what it signs (no proof)."""
        return json.dumps({
            "SignedEntryTimestamp": b64(self.set),
            "Payload": {"body": b64(self.body), "integratedTime": self.integrated_time,
                        "logIndex": self.log_index, "logID": self.log_id.hex()},
        }, separators=(",", ":"))


def log(body: bytes, integrated_time: int, rekor_key, set_key, forge_proof: bool) -> LogEntry:
    """Logs `body` at index 5 of an 8-entry tree: proof and checkpoint by `rekor_key`, SET by `set_key`."""
    index, size = 5, 8
    leaves = [sha256(b"\x00" + f"dummy {i}".encode()) for i in range(size)]
    leaves[index] = sha256(b"\x00" + body)
    root, path = merkle_root_and_path(leaves, index)
    if forge_proof:
        path[0] = sha256(b"forged" + path[0])
    log_index = 41000 + index
    promise = rfc8785.dumps({"body": b64(body), "integratedTime": integrated_time,
                             "logID": key_id(rekor_key).hex(), "logIndex": log_index})
    proof = {
        "logIndex": str(index), "rootHash": b64(root), "treeSize": str(size),
        "hashes": [b64(h) for h in path], "checkpoint": {"envelope": checkpoint(rekor_key, size, root)},
    }
    return LogEntry(body, integrated_time, log_index, key_id(rekor_key), ecdsa(set_key, promise), proof)


def dsse_body(payload: bytes, envelope: dict, signature: bytes, cert: x509.Certificate) -> bytes:
    compact = json.dumps(envelope, separators=(",", ":")).encode()
    return rfc8785.dumps({
        "apiVersion": "0.0.1", "kind": "dsse",
        "spec": {
            "envelopeHash": {"algorithm": "sha256", "value": sha256(compact).hex()},
            "payloadHash": {"algorithm": "sha256", "value": sha256(payload).hex()},
            "signatures": [{"signature": b64(signature), "verifier": b64(pem(cert))}],
        },
    })


def hashedrekord_body(digest_hex: str, signature: bytes, cert: x509.Certificate) -> bytes:
    return rfc8785.dumps({
        "apiVersion": "0.0.1", "kind": "hashedrekord",
        "spec": {
            "data": {"hash": {"algorithm": "sha256", "value": digest_hex}},
            "signature": {"content": b64(signature), "publicKey": {"content": b64(pem(cert))}},
        },
    })


# --- what is signed ------------------------------------------------------------------------------


def statement(digest_hex: str, note: str | None = None) -> bytes:
    """The in-toto statement `cosign sign` signs for an image (no subject name, no predicate)."""
    subject = {"digest": {"sha256": digest_hex}, "annotations": {}}
    if note is not None:
        subject["annotations"] = {"note": note}
    return json.dumps({"_type": STATEMENT, "subject": [subject], "predicateType": SIGN_PREDICATE},
                      separators=(",", ":")).encode()


def pae(payload_type: str, payload: bytes) -> bytes:
    return b"DSSEv1 %d %s %d %s" % (len(payload_type), payload_type.encode(), len(payload), payload)


def simple_signing(reference: str, digest: str) -> bytes:
    """cosign's simple-signing payload naming the image."""
    return json.dumps({
        "critical": {"identity": {"docker-reference": reference},
                     "image": {"docker-manifest-digest": digest},
                     "type": "cosign container image signature"},
        "optional": None,
    }, separators=(",", ":")).encode()


# --- the cases -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Plan:
    """How one signature is made; `good` is the default, each case changes one thing."""

    now: float
    ca: str = "trusted"              # which Fulcio issues the leaf
    ct: str | None = "trusted"       # which CT log signs the SCT (None: no SCT)
    rekor: str | None = "trusted"    # which Rekor logs the entry (None: no log entry)
    set_by: str | None = "trusted"   # which Rekor key signs the SET (None: proof only)
    forge_proof: bool = False
    no_proof: bool = False
    other_digest: bool = False
    tamper: bool = False
    not_before: float = 0.0
    integrated: float = 0.0

    def __post_init__(self):
        self.not_before = self.now - 60
        self.integrated = self.now - 30


def good(plan: Plan) -> None:
    """Signed now by the trusted Fulcio's leaf, SCT by the trusted CT log, logged with SET and proof."""


def expired_inside(plan: Plan) -> None:
    """The leaf expired two days ago, but the log's time lies inside its 10 minutes: still valid."""
    plan.not_before = plan.now - 2 * DAY
    plan.integrated = plan.not_before + 60


def expired_outside(plan: Plan) -> None:
    """The leaf expired two days ago and the log's time is after its notAfter: refused."""
    plan.not_before = plan.now - 2 * DAY
    plan.integrated = plan.now - 30


def tampered_payload(plan: Plan) -> None:
    """The signed bytes are changed after signing (DSSE: the statement, still naming the digest;
    message: the signature is over other bytes; legacy: the payload): the signature fails."""
    plan.tamper = True


def other_digest(plan: Plan) -> None:
    """A whole, valid signature, for another image's digest."""
    plan.other_digest = True


def no_sct(plan: Plan) -> None:
    """The leaf carries no SCT: nothing shows the certificate was logged in CT."""
    plan.ct = None


def forged_sct(plan: Plan) -> None:
    """The SCT is signed by the untrusted CT log key."""
    plan.ct = "other"


def no_tlog(plan: Plan) -> None:
    """No transparency-log entry at all (legacy: no bundle annotation)."""
    plan.rekor = None


def forged_set(plan: Plan) -> None:
    """The signed entry timestamp is by the untrusted Rekor key; the proof and checkpoint are good."""
    plan.set_by = "other"


def forged_proof(plan: Plan) -> None:
    """One hash of the inclusion proof is altered; the SET stays valid (bundles only)."""
    plan.forge_proof = True


def no_proof(plan: Plan) -> None:
    """SET only, no inclusion proof: a v0.3 bundle must carry one (bundles only)."""
    plan.no_proof = True


def no_set(plan: Plan) -> None:
    """Inclusion proof only, no SET: no verified time for the certificate (bundles only)."""
    plan.set_by = None


def untrusted_ca(plan: Plan) -> None:
    """The leaf is issued by the untrusted Fulcio (its SCT by the trusted CT key)."""
    plan.ca = "other"


CASES = {f.__name__.replace("_", "-"): f for f in (
    good, expired_inside, expired_outside, tampered_payload, other_digest, no_sct, forged_sct,
    no_tlog, forged_set, forged_proof, no_proof, no_set, untrusted_ca,
)}
# The legacy annotation carries a SET and no proof: these cases have nothing to change there.
NOT_LEGACY = {"forged-proof", "no-proof", "no-set"}
FORMATS = ("dsse", "message", "legacy")


def applies(fmt: str, case: str) -> bool:
    return not (fmt == "legacy" and case in NOT_LEGACY)


# --- signing -------------------------------------------------------------------------------------


@dataclasses.dataclass
class Signer:
    authorities: dict[str, Authority]
    identity: str
    issuer: str
    reference: str

    def certificate(self, plan: Plan):
        key = ec.generate_private_key(ec.SECP256R1())
        ct_key = self.authorities[plan.ct].ct_key if plan.ct else None
        cert = leaf_certificate(key, self.authorities[plan.ca], ct_key, self.identity, self.issuer,
                                plan.not_before)
        return key, cert

    def log(self, plan: Plan, body: bytes) -> LogEntry | None:
        if plan.rekor is None:
            return None
        rekor_key = self.authorities[plan.rekor].rekor_key
        set_key = self.authorities[plan.set_by or "trusted"].rekor_key
        return log(body, int(plan.integrated), rekor_key, set_key, plan.forge_proof)

    def material(self, plan: Plan, cert, entry: LogEntry | None, kind: str) -> dict:
        entries = [] if entry is None else [
            entry.bundle_json(kind, plan.set_by is not None, not plan.no_proof)]
        return {"certificate": {"rawBytes": b64(cert.public_bytes(serialization.Encoding.DER))},
                "tlogEntries": entries}

    def dsse(self, digest_hex: str, plan: Plan) -> dict:
        key, cert = self.certificate(plan)
        payload = statement(digest_hex)
        signature = ecdsa(key, pae(IN_TOTO, payload))
        if plan.tamper:
            payload = statement(digest_hex, note="tampered")
        envelope = {"payload": b64(payload), "payloadType": IN_TOTO, "signatures": [{"sig": b64(signature)}]}
        entry = self.log(plan, dsse_body(payload, envelope, signature, cert))
        return {"mediaType": BUNDLE_V03, "verificationMaterial": self.material(plan, cert, entry, "dsse"),
                "dsseEnvelope": envelope}

    def message(self, digest_hex: str, plan: Plan) -> dict:
        key, cert = self.certificate(plan)
        digest = bytes.fromhex(digest_hex)
        signed = sha256(b"tampered" + digest) if plan.tamper else digest
        signature = key.sign(signed, ec.ECDSA(Prehashed(hashes.SHA256())))
        entry = self.log(plan, hashedrekord_body(digest_hex, signature, cert))
        return {
            "mediaType": BUNDLE_V03,
            "verificationMaterial": self.material(plan, cert, entry, "hashedrekord"),
            "messageSignature": {"messageDigest": {"algorithm": "SHA2_256", "digest": b64(digest)},
                                 "signature": b64(signature)},
        }

    def legacy(self, digest: str, plan: Plan) -> dict:
        key, cert = self.certificate(plan)
        payload = simple_signing(self.reference, digest)
        signature = ecdsa(key, payload)
        entry = self.log(plan, hashedrekord_body(sha256(payload).hex(), signature, cert))
        if plan.tamper:
            payload = payload.replace(b'"optional":null', b'"optional":{"tampered":"yes"}')
        chain = pem(self.authorities[plan.ca].intermediate) + pem(self.authorities[plan.ca].root)
        annotations = {
            "dev.cosignproject.cosign/signature": b64(signature),
            "dev.sigstore.cosign/certificate": pem(cert).decode(),
            "dev.sigstore.cosign/chain": chain.decode(),
        }
        if entry is not None:
            annotations["dev.sigstore.cosign/bundle"] = entry.cosign_annotation()
        # The same signature as a v0.1 bundle for sigstore-python, which also wants the proof.
        material = {"x509CertificateChain": {"certificates": [
            {"rawBytes": b64(cert.public_bytes(serialization.Encoding.DER))}]},
            "tlogEntries": [] if entry is None else [entry.bundle_json("hashedrekord", True)]}
        reference_bundle = {
            "mediaType": BUNDLE_V01,
            "verificationMaterial": material,
            "messageSignature": {"messageDigest": {"algorithm": "SHA2_256", "digest": b64(sha256(payload))},
                                 "signature": b64(signature)},
        }
        return {"payload": b64(payload), "annotations": annotations, "reference_bundle": reference_bundle}

    def sign(self, fmt: str, case: str, digest: str, now: float) -> dict:
        plan = Plan(now)
        CASES[case](plan)
        if plan.other_digest:
            digest = "sha256:" + sha256(digest.encode()).hex()
        hex_ = digest.removeprefix("sha256:")
        if fmt == "dsse":
            return self.dsse(hex_, plan)
        if fmt == "message":
            return self.message(hex_, plan)
        return self.legacy(digest, plan)


# --- command line --------------------------------------------------------------------------------


def signer(args) -> Signer:
    directory = Path(args.dir)
    authorities = {"trusted": Authority.load(directory), "other": Authority.load(directory / "other")}
    reference = args.reference or "registry.local/image"
    return Signer(authorities, args.identity, args.issuer, reference)


def digest_arg(value: str) -> str:
    hex_ = value.removeprefix("sha256:")
    if not value.startswith("sha256:") or len(hex_) != 64 or any(c not in "0123456789abcdef" for c in hex_):
        raise argparse.ArgumentTypeError("expected sha256:<64 lowercase hex>")
    return value


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("init").add_argument("dir")
    for name in ("sign", "sign-all"):
        sub = commands.add_parser(name)
        sub.add_argument("dir")
        sub.add_argument("--digest", required=True, type=digest_arg)
        sub.add_argument("--identity", required=True)
        sub.add_argument("--issuer", required=True)
        sub.add_argument("--reference")
        sub.add_argument("--out", required=True)
        if name == "sign":
            sub.add_argument("--format", required=True, choices=FORMATS)
            sub.add_argument("--case", default="good", choices=sorted(CASES))
    args = parser.parse_args(argv)
    if args.command == "init":
        init(Path(args.dir))
        return 0
    now = time.time()
    made = signer(args)
    if args.command == "sign":
        if not applies(args.format, args.case):
            parser.error(f"case {args.case} has nothing to change in the {args.format} format")
        Path(args.out).write_text(json.dumps(made.sign(args.format, args.case, args.digest, now), indent=2))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for fmt in FORMATS:
        for case in CASES:
            if applies(fmt, case):
                signed = made.sign(fmt, case, args.digest, now)
                (out / f"{fmt}-{case}.json").write_text(json.dumps(signed, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
