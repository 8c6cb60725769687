"""Lists and calls the relay through gRPC reflection alone, as grpcurl-style tools do.

Usage: reflection_client.py HOST:PORT

Uses Python's grpcio-reflection (the v1alpha reflection service) to discover the services,
builds the request and response types from the served descriptors (no generated code), calls
CreateSession and GetSession, and prints what it found as one JSON object.
"""

import json
import sys

import grpc
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = sorted(database.get_services())
        pool = DescriptorPool(database)
        service = pool.FindServiceByName("toolrelay.v1.Relay")

        def call(name: str, request: dict) -> dict:
            method = service.FindMethodByName(name)
            request_type = message_factory.GetMessageClass(method.input_type)
            response_type = message_factory.GetMessageClass(method.output_type)
            stub = channel.unary_unary(
                f"/{service.full_name}/{name}",
                request_serializer=request_type.SerializeToString,
                response_deserializer=response_type.FromString,
            )
            reply = stub(json_format.ParseDict(request, request_type()), timeout=10)
            return json_format.MessageToDict(reply)

        created = call("CreateSession", {})
        info = call("GetSession", {"code": created["code"]})
        print(
            json.dumps(
                {
                    "services": services,
                    "methods": [method.name for method in service.methods],
                    "created": created,
                    "info": info,
                }
            )
        )


if __name__ == "__main__":
    main(sys.argv[1])
