// sandbox.ports: a local TCP listener whose connections are relayed to a
// port in the sandbox over PortForward streams (like kubectl port-forward).

import * as net from "node:net";
import { ClientDuplexStream } from "@grpc/grpc-js";
import { PortForwardRequest, PortForwardResponse } from "../gen/berth/v1/port";
import { Connection } from "./connection";
import { BerthError, fromServiceError, intArg } from "./errors";

/**
 * A listener on host:port (address is "host:port") relaying each
 * connection to the sandbox's 127.0.0.1:remotePort through its own
 * PortForward stream, with flow control both ways. A connection to a port
 * nothing listens on in the sandbox is closed at once (berthd:
 * PORT_CLOSED); the last failed connection's error is in lastError.
 * close() (or `await using`) stops listening and ends the connections.
 */
export class PortForward {
  readonly host: string;
  readonly port: number;
  readonly address: string;
  lastError: BerthError | Error | undefined;
  private readonly calls = new Set<ClientDuplexStream<PortForwardRequest, PortForwardResponse>>();
  private readonly sockets = new Set<net.Socket>();

  /** @internal use sandbox.ports.forward. */
  constructor(private readonly conn: Connection, private readonly sandboxId: string, readonly remotePort: number, private readonly server: net.Server) {
    const a = server.address() as net.AddressInfo;
    this.host = a.address;
    this.port = a.port;
    this.address = `${a.address}:${a.port}`;
    server.on("connection", (s) => this.relay(s));
  }

  private relay(s: net.Socket): void {
    const call = this.conn.sandboxes.portForward(this.conn.metadata());
    this.calls.add(call);
    this.sockets.add(s);
    call.write(PortForwardRequest.fromPartial({ event: { $case: "start", value: { sandboxId: this.sandboxId, port: this.remotePort } } }));
    s.on("data", (d: Buffer) => {
      if (!call.write(PortForwardRequest.fromPartial({ event: { $case: "data", value: d } }))) {
        s.pause();
        call.once("drain", () => s.resume());
      }
    });
    s.on("end", () => call.end()); // the local side's half-close
    s.on("error", (e) => {
      this.lastError = e;
      call.cancel();
    });
    s.on("close", () => {
      this.sockets.delete(s);
      call.cancel();
    });
    call.on("data", (m: PortForwardResponse) => {
      if (m.event?.$case === "data") {
        if (!s.write(m.event.value)) {
          call.pause();
          s.once("drain", () => call.resume());
        }
      } else if (m.event?.$case === "eof") {
        s.end();
      }
    });
    call.on("error", (e) => {
      if ((e as { code?: number }).code !== 1) this.lastError = fromServiceError(e);
      s.destroy();
    });
    call.on("end", () => s.end());
    call.on("close", () => this.calls.delete(call));
  }

  /** close stops listening and ends every relayed connection. */
  async close(): Promise<void> {
    for (const c of this.calls) c.cancel();
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The ports of one sandbox (sandbox.ports). */
export class Ports {
  /** @internal */
  constructor(private readonly conn: Connection, private readonly sandboxId: string) {}

  /**
   * forward listens on host:localPort (localPort 0: a free port; host
   * default 127.0.0.1) and relays each connection to port inside the
   * sandbox; .address is what to dial. port outside 1-65535 or localPort
   * outside 0-65535: InvalidArgument.
   */
  async forward(port: number, options: { localPort?: number; host?: string } = {}): Promise<PortForward> {
    intArg("port", port, 65535, 1);
    intArg("localPort", options.localPort, 65535);
    const server = net.createServer({ allowHalfOpen: true });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(options.localPort ?? 0, options.host ?? "127.0.0.1", () => resolve());
    });
    return new PortForward(this.conn, this.sandboxId, port, server);
  }
}
