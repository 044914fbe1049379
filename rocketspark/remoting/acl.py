"""RocketMQ ACL 1.0 request signing: AccessKey and Signature in every request's extFields.

As RocketMQ's ``AclClientRPCHook``: the request's extFields get ``AccessKey``
(and ``SecurityToken`` when one is given); the values of all extFields except
``Signature``, sorted by key and concatenated, followed by the body, are
signed with HmacSHA1 under the secret key; the Base64 of that is
``Signature``. A broker with ``aclEnable`` checks the signature and the
account's permissions and answers NO_PERMISSION (16) or a SYSTEM_ERROR whose
remark says what failed.

The secret never leaves this module: :class:`Credentials` keeps it out of its
repr, and no error or log line here includes it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

__all__ = ["ACCESS_KEY", "SECURITY_TOKEN", "SIGNATURE", "Credentials", "signature"]

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"

# The environment variables credentials are read from when no option gives them.
ENV_ACCESS_KEY = "ROCKETMQ_ACCESS_KEY"
ENV_SECRET_KEY = "ROCKETMQ_SECRET_KEY"


def signature(
    ext_fields: Mapping[str, str], body: bytes | bytearray | memoryview | None, secret: str
) -> str:
    """Base64(HmacSHA1(secret, sorted extField values (but Signature's) + body))."""
    mac = hmac.new(secret.encode("utf-8"), digestmod=hashlib.sha1)
    mac.update("".join(v for k, v in sorted(ext_fields.items()) if k != SIGNATURE).encode("utf-8"))
    if body:
        mac.update(body)
    return base64.b64encode(mac.digest()).decode("ascii")


@dataclass(frozen=True)
class Credentials:
    """An ACL account: access key, secret key and an optional security token.

    The repr shows the access key only; the secret and token are never printed.
    """

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_options(
        cls,
        access_key: str | None,
        secret_key: str | None,
        *,
        environ: Mapping[str, str] = os.environ,
    ) -> Credentials | None:
        """Credentials from the options, else from ROCKETMQ_ACCESS_KEY / ROCKETMQ_SECRET_KEY;
        None when neither gives an access key. ValueError when only one half is given."""
        ak = access_key or environ.get(ENV_ACCESS_KEY) or None
        sk = secret_key or environ.get(ENV_SECRET_KEY) or None
        if ak is None and sk is None:
            return None
        if ak is None or sk is None:
            missing = "accessKey" if ak is None else "secretKey"
            raise ValueError(
                f"{missing} is missing: an ACL account needs both accessKey and secretKey "
                f"(options, or {ENV_ACCESS_KEY} / {ENV_SECRET_KEY})"
            )
        return cls(ak, sk)

    def sign(
        self, ext_fields: MutableMapping[str, str], body: bytes | bytearray | memoryview | None
    ) -> None:
        """Add AccessKey, SecurityToken (if any) and Signature to a request's extFields."""
        ext_fields[ACCESS_KEY] = self.access_key
        if self.security_token is not None:
            ext_fields[SECURITY_TOKEN] = self.security_token
        ext_fields[SIGNATURE] = signature(ext_fields, body, self.secret_key)
