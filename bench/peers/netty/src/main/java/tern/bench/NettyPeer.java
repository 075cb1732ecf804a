// tern benchmark peer: Netty 4.1.137.Final (pinned in pom.xml), the way Netty's own
// examples do it (example/http/helloworld and example/http/websocketx/
// benchmarkserver):
//
//   - ONE event loop thread, used as both boss and worker group (the suite
//     runs every server on one core with one thread of event processing);
//     the native epoll transport (EpollEventLoopGroup), NIO only when
//     Epoll.isAvailable() is false. Which one is printed to stderr at start.
//   - pipeline: HttpServerCodec, HttpObjectAggregator(16 MiB), Handler.
//     Handler serves GET /ping -> "pong", GET /echo?size=N -> N bytes (N up
//     to 1 MiB, like the Go peers), POST /echo -> the body (not copied), all
//     keep-alive with Content-Length set.
//   - GET / and /ws: WebSocket handshake with WebSocketServerHandshakerFactory
//     (one handshaker, two paths; WebSocketServerProtocolHandler takes one
//     path), no extensions, so no permessage-deflate; max frame payload
//     16 MiB. After the handshake a WebSocketFrameAggregator(16 MiB) goes
//     after the frame decoder, so a fragmented message is echoed whole.
//   - echo: the Text/BinaryWebSocketFrame itself is written back (retained,
//     not copied) on channelRead and flushed on channelReadComplete, so one
//     flush per read batch. Ping -> pong, close -> close reply, then close.
//   - Defaults otherwise: pooled direct buffers, TCP_NODELAY on (Netty's
//     default), no JVM flags. The JVM adds its own threads (14 besides the
//     event loop when pinned to one CPU: VM, JIT, signal, ...; with one CPU it
//     picks SerialGC, so no GC worker threads).
//
//   - bench/run fanout: /fanout answers each message with 10 binary frames of
//     10 000 bytes (one constant buffer, duplicated); /fanout/sub channels
//     join a ChannelGroup, and each message on /fanout/pub goes to the group
//     with writeAndFlush (one buffer, a retained duplicate per channel), to
//     the channels that are writable (under Netty's 64 KiB high-water mark):
//     a slow subscriber misses messages, as with tern's default policy.
//
//   - -tls-cert F -tls-key F (PEM; the key PKCS#8): HTTPS and WSS on -addr,
//     an SslHandler first in every pipeline, from SslContextBuilder.forServer
//     with the JDK's TLS (SslProvider.JDK; netty-tcnative is not a dependency).
//
// Run: java -jar tern-bench-netty.jar -addr 127.0.0.1:PORT [-tls-cert F -tls-key F]
package tern.bench;

import io.netty.bootstrap.ServerBootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelFutureListener;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.ServerChannel;
import io.netty.channel.SimpleChannelInboundHandler;
import io.netty.channel.epoll.Epoll;
import io.netty.channel.epoll.EpollEventLoopGroup;
import io.netty.channel.epoll.EpollServerSocketChannel;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.channel.socket.SocketChannel;
import io.netty.channel.socket.nio.NioServerSocketChannel;
import io.netty.handler.codec.http.DefaultFullHttpResponse;
import io.netty.handler.codec.http.FullHttpRequest;
import io.netty.handler.codec.http.FullHttpResponse;
import io.netty.handler.codec.http.HttpHeaderNames;
import io.netty.handler.codec.http.HttpHeaderValues;
import io.netty.handler.codec.http.HttpMethod;
import io.netty.handler.codec.http.HttpObjectAggregator;
import io.netty.handler.codec.http.HttpResponseStatus;
import io.netty.handler.codec.http.HttpServerCodec;
import io.netty.handler.codec.http.HttpUtil;
import io.netty.handler.codec.http.QueryStringDecoder;
import io.netty.handler.codec.http.websocketx.BinaryWebSocketFrame;
import io.netty.handler.codec.http.websocketx.CloseWebSocketFrame;
import io.netty.handler.codec.http.websocketx.PingWebSocketFrame;
import io.netty.handler.codec.http.websocketx.PongWebSocketFrame;
import io.netty.handler.codec.http.websocketx.TextWebSocketFrame;
import io.netty.handler.codec.http.websocketx.WebSocketFrame;
import io.netty.handler.codec.http.websocketx.WebSocketFrameAggregator;
import io.netty.handler.codec.http.websocketx.WebSocketHandshakeException;
import io.netty.handler.codec.http.websocketx.WebSocketServerHandshaker;
import io.netty.handler.codec.http.websocketx.WebSocketServerHandshakerFactory;
import io.netty.channel.group.ChannelGroup;
import io.netty.channel.group.DefaultChannelGroup;
import io.netty.util.CharsetUtil;
import io.netty.util.concurrent.GlobalEventExecutor;
import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslContextBuilder;
import io.netty.handler.ssl.SslProvider;
import java.io.File;
import java.util.List;

public final class NettyPeer {
    static final int MAX = 16 << 20; // largest message / request body: 16 MiB

    public static void main(String[] args) throws Exception {
        String addr = "127.0.0.1:9091";
        String cert = null, key = null;
        for (int i = 0; i < args.length; i++) {
            String a = args[i];
            if (a.equals("-tls-cert") && i + 1 < args.length) {
                cert = args[++i];
            } else if (a.equals("-tls-key") && i + 1 < args.length) {
                key = args[++i];
            } else if ((a.equals("-addr") || a.equals("--addr")) && i + 1 < args.length) {
                addr = args[++i];
            } else if (a.startsWith("-addr=") || a.startsWith("--addr=")) {
                addr = a.substring(a.indexOf('=') + 1);
            } else {
                System.err.println("usage: tern-bench-netty -addr HOST:PORT [-tls-cert F -tls-key F]");
                System.exit(2);
            }
        }
        int colon = addr.lastIndexOf(':');
        String host = addr.substring(0, colon);
        int port = Integer.parseInt(addr.substring(colon + 1));

        final SslContext ssl = cert != null && key != null
                ? SslContextBuilder.forServer(new File(cert), new File(key))
                        .sslProvider(SslProvider.JDK).build()
                : null;
        boolean epoll = Epoll.isAvailable();
        EventLoopGroup group = epoll ? new EpollEventLoopGroup(1) : new NioEventLoopGroup(1);
        Class<? extends ServerChannel> channel =
                epoll ? EpollServerSocketChannel.class : NioServerSocketChannel.class;
        System.err.println("netty: transport " + (epoll ? "epoll" : "nio (epoll unavailable: "
                + Epoll.unavailabilityCause() + ")") + ", 1 event loop thread, " + addr + (ssl != null ? ", TLS (JDK)" : ""));
        try {
            ServerBootstrap b = new ServerBootstrap()
                    .group(group, group) // the same single thread accepts and serves
                    .channel(channel)
                    .childHandler(new ChannelInitializer<SocketChannel>() {
                        @Override
                        protected void initChannel(SocketChannel ch) {
                            if (ssl != null) {
                                ch.pipeline().addLast(ssl.newHandler(ch.alloc()));
                            }
                            ch.pipeline().addLast(new HttpServerCodec(),
                                    new HttpObjectAggregator(MAX), new Handler());
                        }
                    });
            b.bind(host, port).sync().channel().closeFuture().sync();
        } finally {
            group.shutdownGracefully();
        }
    }

    /** 1 MiB of 'x', shared by every GET /echo response (sliced, not copied). */
    static final ByteBuf XS = constant("x".repeat(1 << 20));
    static final ByteBuf PONG = constant("pong");
    static final ByteBuf BLOCK = constant("\0".repeat(10000));
    static final ChannelGroup SUBS = new DefaultChannelGroup(GlobalEventExecutor.INSTANCE);

    enum Route { ECHO, FANOUT, SUB, PUB }

    /** As Netty's own benchmark servers keep a constant body: direct, never freed. */
    static ByteBuf constant(String s) {
        byte[] b = s.getBytes(CharsetUtil.US_ASCII);
        return Unpooled.unreleasableBuffer(Unpooled.directBuffer(b.length).writeBytes(b));
    }

    /** One per connection: HTTP routes, then (after the handshake) WebSocket echo. */
    static final class Handler extends SimpleChannelInboundHandler<Object> {
        private WebSocketServerHandshaker handshaker;
        private Route route = Route.ECHO;

        @Override
        protected void channelRead0(ChannelHandlerContext ctx, Object msg) {
            if (msg instanceof WebSocketFrame) {
                frame(ctx, (WebSocketFrame) msg);
            } else if (msg instanceof FullHttpRequest) {
                request(ctx, (FullHttpRequest) msg);
            }
        }

        @Override
        public void channelReadComplete(ChannelHandlerContext ctx) {
            ctx.flush();
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            ctx.close(); // resets, protocol violations, too-large messages: just drop it
        }

        private void frame(ChannelHandlerContext ctx, WebSocketFrame f) {
            if (f instanceof BinaryWebSocketFrame || f instanceof TextWebSocketFrame) {
                switch (route) {
                case FANOUT:
                    for (int i = 0; i < 10; i++) {
                        ctx.write(new BinaryWebSocketFrame(BLOCK.duplicate()));
                    }
                    break;
                case PUB: // the group releases the frame once written to every channel
                    SUBS.writeAndFlush(new BinaryWebSocketFrame(f.content().retain()),
                            ch -> ch.isWritable());
                    break;
                case SUB:
                    break;
                default:
                    ctx.write(f.retain()); // the same frame back: same opcode, same bytes, FIN set
                }
            } else if (f instanceof PingWebSocketFrame) {
                ctx.write(new PongWebSocketFrame(f.content().retain()));
            } else if (f instanceof CloseWebSocketFrame) {
                handshaker.close(ctx, (CloseWebSocketFrame) f.retain()); // reply, flush, close
            } // pong: ignored
        }

        private void request(ChannelHandlerContext ctx, FullHttpRequest req) {
            if (!req.decoderResult().isSuccess()) {
                respond(ctx, req, HttpResponseStatus.BAD_REQUEST, Unpooled.EMPTY_BUFFER, null, false);
                return;
            }
            QueryStringDecoder q = new QueryStringDecoder(req.uri());
            String path = q.path();
            HttpMethod m = req.method();
            boolean ws = path.equals("/") || path.equals("/ws") || path.equals("/fanout")
                    || path.equals("/fanout/sub") || path.equals("/fanout/pub");
            if (ws && m.equals(HttpMethod.GET)) {
                route = path.equals("/fanout") ? Route.FANOUT : path.equals("/fanout/sub") ? Route.SUB
                        : path.equals("/fanout/pub") ? Route.PUB : Route.ECHO;
                WebSocketServerHandshakerFactory factory = new WebSocketServerHandshakerFactory(
                        "ws://" + req.headers().get(HttpHeaderNames.HOST) + path,
                        null, false /* no extensions: no permessage-deflate */, MAX);
                handshaker = factory.newHandshaker(req);
                if (handshaker == null) {
                    WebSocketServerHandshakerFactory.sendUnsupportedVersionResponse(ctx.channel());
                    return;
                }
                // Replaces HttpServerCodec by the frame decoder/encoder and
                // removes HttpObjectAggregator; the decoder is in place when
                // this returns, so the frame aggregator can go right after it.
                try {
                    handshaker.handshake(ctx.channel(), req);
                } catch (WebSocketHandshakeException e) {
                    // not an upgrade request (no Upgrade/Key headers): 400, as
                    // WebSocketServerProtocolHandler answers it
                    handshaker = null;
                    respond(ctx, req, HttpResponseStatus.BAD_REQUEST, Unpooled.EMPTY_BUFFER, null, false);
                    return;
                }
                ctx.pipeline().addAfter("wsdecoder", "wsaggregator", new WebSocketFrameAggregator(MAX));
                if (route == Route.SUB) {
                    SUBS.add(ctx.channel()); // and out of it when the channel closes
                }
            } else if (path.equals("/ping") && m.equals(HttpMethod.GET)) {
                respond(ctx, req, HttpResponseStatus.OK, PONG.duplicate(), HttpHeaderValues.TEXT_PLAIN, true);
            } else if (path.equals("/echo") && m.equals(HttpMethod.GET)) {
                int n = -1;
                List<String> size = q.parameters().get("size");
                try {
                    n = Integer.parseInt(size.get(0));
                } catch (RuntimeException e) {
                    // missing or not a number
                }
                if (n < 0 || n > XS.readableBytes()) {
                    respond(ctx, req, HttpResponseStatus.BAD_REQUEST, Unpooled.EMPTY_BUFFER, null, true);
                } else {
                    respond(ctx, req, HttpResponseStatus.OK, XS.slice(0, n),
                            HttpHeaderValues.APPLICATION_OCTET_STREAM, true);
                }
            } else if (path.equals("/echo") && m.equals(HttpMethod.POST)) {
                respond(ctx, req, HttpResponseStatus.OK, req.content().retain(),
                        HttpHeaderValues.APPLICATION_OCTET_STREAM, true);
            } else {
                respond(ctx, req, HttpResponseStatus.NOT_FOUND, Unpooled.EMPTY_BUFFER, null, true);
            }
        }

        /** As Netty's HttpHelloWorldServerHandler: Content-Length, keep-alive unless asked not to. */
        private static void respond(ChannelHandlerContext ctx, FullHttpRequest req, HttpResponseStatus status,
                                    ByteBuf body, CharSequence type, boolean canKeepAlive) {
            boolean keepAlive = canKeepAlive && HttpUtil.isKeepAlive(req);
            FullHttpResponse res = new DefaultFullHttpResponse(req.protocolVersion(), status, body);
            if (type != null) {
                res.headers().set(HttpHeaderNames.CONTENT_TYPE, type);
            }
            res.headers().setInt(HttpHeaderNames.CONTENT_LENGTH, body.readableBytes());
            if (keepAlive) {
                if (!req.protocolVersion().isKeepAliveDefault()) {
                    res.headers().set(HttpHeaderNames.CONNECTION, HttpHeaderValues.KEEP_ALIVE);
                }
            } else {
                res.headers().set(HttpHeaderNames.CONNECTION, HttpHeaderValues.CLOSE);
            }
            ChannelFuture f = ctx.write(res);
            if (!keepAlive) {
                f.addListener(ChannelFutureListener.CLOSE);
            }
        }
    }
}
