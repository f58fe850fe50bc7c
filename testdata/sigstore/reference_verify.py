#!/usr/bin/env python3
"""sigstore-python (4.5) as the referee of the keyless tests: does this signature verify for
this image digest, identity and issuer, against this trusted root, offline?

    reference_verify.py --trusted-root F --bundle B --digest sha256:HEX --identity ID --issuer ISS [--legacy]
    reference_verify.py --trusted-root F --batch CASES.json

Exit 0: verified; 1: refused (one line on stderr, sigstore-python's reason); 2: usage error.
With --batch, CASES.json is a list of {"bundle", "digest", "identity", "issuer", "legacy"} and
one JSON line {"bundle", "verified", "reason"} is printed per case (exit 0).

B is a bundle v0.3 (DSSE: `cosign sign`'s in-toto statement; or a message signature over the
manifest digest), or with --legacy the JSON `private_sigstore.py sign --format legacy` writes:
its `reference_bundle` is verified over the simple-signing payload, whose
docker-manifest-digest must be the digest. Identities are matched exactly (sigstore-python has
no regular expressions); the issuer is read from OID 1.3.6.1.4.1.57264.1.1.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys

from sigstore.errors import Error as SigstoreError
from sigstore.hashes import Hashed
from sigstore.models import Bundle, TrustedRoot
from sigstore.verify import Verifier, policy
from sigstore_models.common.v1 import HashAlgorithm

IN_TOTO = "application/vnd.in-toto+json"
STATEMENT = "https://in-toto.io/Statement/v1"
SIGN_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
# sigstore-python quotes whole proofs in some reasons; the head names the cause.
REASON_LIMIT = 240


class Refused(Exception):
    """A check of ours (not sigstore-python's) failed."""


def verify_dsse(verifier: Verifier, bundle: Bundle, hex_: str, identity: policy.Identity) -> None:
    payload_type, payload = verifier.verify_dsse(bundle, identity)
    # sigstore-python checks the envelope, not what it says: the statement's binding is ours.
    if payload_type != IN_TOTO:
        raise Refused(f"payloadType {payload_type!r} is not in-toto")
    doc = json.loads(payload)
    if doc.get("_type") != STATEMENT or doc.get("predicateType") != SIGN_PREDICATE:
        raise Refused(f"not a cosign sign statement: {doc.get('_type')} {doc.get('predicateType')}")
    if not any(s.get("digest", {}).get("sha256") == hex_ for s in doc.get("subject", [])):
        raise Refused(f"no subject names sha256:{hex_}")


def verify_message(verifier: Verifier, bundle: Bundle, hex_: str, identity: policy.Identity) -> None:
    hashed = Hashed(algorithm=HashAlgorithm.SHA2_256, digest=bytes.fromhex(hex_))
    verifier.verify_artifact(hashed, bundle, identity)


def verify_legacy(verifier: Verifier, signed: dict, digest: str, identity: policy.Identity) -> None:
    payload = base64.b64decode(signed["payload"])
    bundle = Bundle.from_json(json.dumps(signed["reference_bundle"]))
    verifier.verify_artifact(payload, bundle, identity)
    named = json.loads(payload)["critical"]["image"]["docker-manifest-digest"]
    if named != digest:
        raise Refused(f"the payload names {named}, not {digest}")


def verdict(verifier: Verifier, path: str, digest: str, identity: str, issuer: str, legacy: bool) -> str | None:
    """None when verified, else the reason."""
    wanted = policy.Identity(identity=identity, issuer=issuer)
    hex_ = digest.removeprefix("sha256:")
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if legacy:
            verify_legacy(verifier, json.loads(raw), digest, wanted)
            return None
        bundle = Bundle.from_json(raw)
        if json.loads(raw).get("dsseEnvelope") is not None:
            verify_dsse(verifier, bundle, hex_, wanted)
        else:
            verify_message(verifier, bundle, hex_, wanted)
        return None
    except (SigstoreError, Refused, ValueError, KeyError) as e:
        reason = f"{type(e).__name__}: {e}".replace("\n", " ")
        return reason if len(reason) <= REASON_LIMIT else reason[:REASON_LIMIT] + "…"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trusted-root", required=True)
    parser.add_argument("--batch")
    parser.add_argument("--bundle")
    parser.add_argument("--digest")
    parser.add_argument("--identity")
    parser.add_argument("--issuer")
    parser.add_argument("--legacy", action="store_true")
    args = parser.parse_args(argv)
    single = (args.bundle, args.digest, args.identity, args.issuer)
    if args.batch is None and not all(single):
        parser.error("--bundle, --digest, --identity and --issuer are required without --batch")
    if args.batch is not None and any(single):
        parser.error("--batch takes its cases from the file")
    if args.digest is not None and not args.digest.startswith("sha256:"):
        parser.error("--digest must be sha256:<hex>")
    try:
        verifier = Verifier(trusted_root=TrustedRoot.from_file(args.trusted_root))
    except (OSError, SigstoreError, ValueError) as e:
        parser.error(f"--trusted-root {args.trusted_root}: {e}")
    if args.batch is None:
        reason = verdict(verifier, args.bundle, args.digest, args.identity, args.issuer, args.legacy)
        if reason is not None:
            print(reason, file=sys.stderr)
            return 1
        return 0
    with open(args.batch) as f:
        cases = json.load(f)
    for case in cases:
        reason = verdict(verifier, case["bundle"], case["digest"], case["identity"], case["issuer"],
                         case.get("legacy", False))
        print(json.dumps({"bundle": case["bundle"], "verified": reason is None, "reason": reason}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
