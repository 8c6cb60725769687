"""Calls one tool of a session over gRPC (`toolrelay.v1.Relay/Call`), as a backend would.

Usage: grpc_call.py HOST:PORT CODE FUNCTION ARGS_JSON [REQUEST_ID]

Builds the request from the descriptors the relay serves by reflection (no generated code,
like reflection_client.py) and prints the RequestState as one JSON object.
"""

import json
import sys

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main(address: str, code: str, function: str, args: str, request_id: str) -> None:
    with grpc.insecure_channel(address) as channel:
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        method = pool.FindServiceByName("toolrelay.v1.Relay").FindMethodByName("Call")
        request_type = message_factory.GetMessageClass(method.input_type)
        response_type = message_factory.GetMessageClass(method.output_type)
        call = channel.unary_unary(
            "/toolrelay.v1.Relay/Call",
            request_serializer=request_type.SerializeToString,
            response_deserializer=response_type.FromString,
        )
        request = {"code": code, "functionName": function, "args": json.loads(args), "timeoutMs": 30000}
        if request_id:
            request["requestId"] = request_id
        reply = call(json_format.ParseDict(request, request_type()), timeout=40)
        print(json.dumps(json_format.MessageToDict(reply)))


if __name__ == "__main__":
    main(*sys.argv[1:5], sys.argv[5] if len(sys.argv) > 5 else "")
