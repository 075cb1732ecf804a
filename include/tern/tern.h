/* tern: HTTP/1.1 and WebSocket on one event loop per thread. */
#ifndef TERN_H
#define TERN_H

#include "tern/loop.h"
#include "tern/net.h"
#include "tern/http.h"
#include "tern/ws.h"
#include "tern/client.h"
#include "tern/url.h"
#include "tern/pubsub.h"
#include "tern/tls.h"
#include "tern/log.h"
#include "tern/run.h"

#define TERN_VERSION "0.1.0"

#endif
