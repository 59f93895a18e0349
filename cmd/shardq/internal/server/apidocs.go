// SPDX-License-Identifier: Apache-2.0

package server

import "net/http"

// apiDoc describes one operation of the OpenAPI document (openapi.go
// builds it from these and the Go types they name). apiDocs holds one per
// route of apiRoutes, by the same pattern, and one per route the server
// answers without a token; the role comes from the route itself.
type apiDoc struct {
	id, summary, description string
	// params holds the path, query and header parameters, as fields
	// tagged path, query or header.
	params any
	// body is a JSON request body: the type its handler decodes into
	// (emptyIn: no body, or {}). rawBody is instead the media type of a
	// body of bytes.
	body         any
	optionalBody bool
	rawBody      string
	responses    []apiResponse
	// problems are the statuses answered with a problem besides those
	// of every route behind a token (authProblems) and 413 of every
	// route that reads a body; notes says more of some of them than "an
	// RFC 9457 problem".
	problems []int
	notes    map[int]string
}

// apiResponse is a response other than a problem: a JSON body of the
// type body, or bytes of the media type raw, or nothing.
type apiResponse struct {
	status      int
	description string
	body        any
	raw         string
	headers     map[string]string // name: description
}

// authProblems are the statuses any route behind a token may answer
// with a problem: a malformed tenant, no or a bad token, the wrong role,
// the token's rate, and the database failing or not answering.
var authProblems = []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests,
	http.StatusInternalServerError, http.StatusServiceUnavailable}

// okJSON is a 200 answering a JSON body of body's type.
func okJSON(body any) []apiResponse { return []apiResponse{{status: http.StatusOK, body: body}} }

// The parameters of the routes under a tenant, a topic and a consumer
// group.
type (
	tenantParams struct {
		Tenant string `path:"tenant" description:"tenant (ASCII, 1-255 bytes)"`
	}
	topicParams struct {
		tenantParams
		Topic string `path:"topic"`
	}
	groupParams struct {
		topicParams
		Group string `path:"group" description:"consumer group"`
	}
	// pageParams pages a listing (admin.go's scope).
	pageParams struct {
		Limit int    `query:"limit" minimum:"1" maximum:"10000"`
		After string `query:"after" description:"the sort key's last value; repeat per column"`
	}
	sessionParams struct {
		groupParams
		Session string `header:"Shardq-Session" required:"true" description:"the session id a receive with hold returned"`
	}
)

// octetStream is the media type of a body of bytes.
const octetStream = "application/octet-stream"

var apiDocs = map[string]apiDoc{
	"POST " + topicRoute + "/messages": {
		id: "publish", summary: "Publish one message, or many in one transaction",
		params: topicParams{}, body: publishIn{}, responses: okJSON(publishOut{}),
		problems: []int{http.StatusConflict},
	},
	"POST " + topicRoute + "/large": {
		id: "publishLarge", summary: "Upload a large message: the request body, of any size up to --max-large-bytes, streamed into chunks (PublishLarge)",
		description: "The body is read and stored as it arrives, 256 KiB chunks, 16 to a transaction; the server holds one transaction's chunks. " +
			"The message exists for readers once the whole body is stored: a body cut short, over the limit, or not matching the Repr-Digest " +
			"(or Content-Digest) the client sent stores nothing readers see (its chunks are marked aborted). Content-Length or chunked transfer " +
			"encoding. Publishing the same bytes again under the same id returns the first result (a resume after an unknown outcome); other " +
			"bytes under a taken id are 409.",
		params: struct {
			topicParams
			Key        string   `query:"key" description:"partition key (message group); default a fresh large-<uuid>, where nothing else is published"`
			ID         string   `query:"id" description:"message id (default a UUIDv7); at most 244 bytes: chunk ids add #n"`
			Header     []string `query:"header" collectionFormat:"multi" description:"name:value, repeatable: the message's headers"`
			ReprDigest string   `header:"Repr-Digest" description:"sha-256=:<base64>: (RFC 9530): the body must match it"`
		}{},
		rawBody: octetStream,
		responses: []apiResponse{{status: http.StatusOK, description: "stored", body: largeResultOut{},
			headers: map[string]string{"Repr-Digest": "sha-256=:<base64>: of the stored body"}}},
		problems: []int{http.StatusRequestTimeout, http.StatusConflict},
		notes: map[int]string{
			http.StatusBadRequest:      "a validation error, or the body ended before it was complete (incomplete-request; its chunks are marked aborted)",
			http.StatusRequestTimeout:  "the upload was cut for its pace (transfer-too-slow, under --min-transfer-rate) or took longer than --large-transfer-timeout; its chunks are marked aborted",
			http.StatusTooManyRequests: "a publish rate, or no transfer slot (server-wide, per token, per tenant), with Retry-After",
		},
	},
	"POST " + groupRoute + "/receive": {
		id: "receive", summary: "Receive messages with receipts (SQS FIFO's ReceiveMessage)",
		params: groupParams{}, body: receiveIn{}, responses: okJSON(receiveOut{}),
		problems: []int{http.StatusConflict},
	},
	"GET " + groupRoute + "/body": {
		id: "readBody", summary: "Read a received large message's body by its receipt (the body_url of its entry)",
		description: "Streams the assembled body, one chunk read at a time. Repr-Digest and ETag carry its SHA-256 from the start; " +
			"Range (bytes=N-) resumes after a cut. The size and SHA-256 are checked as the last bytes go out: on a mismatch they are " +
			"withheld, so the response falls short of its Content-Length; nack the message then. The receipt is checked; its lease need not be current.",
		params: struct {
			groupParams
			Receipt string `query:"receipt" required:"true" description:"the receipt of a large message"`
			Range   string `header:"Range" description:"bytes=N- or bytes=N-M"`
		}{},
		responses: []apiResponse{
			{status: http.StatusOK, description: "the body", raw: octetStream, headers: map[string]string{"Repr-Digest": "", "ETag": ""}},
			{status: http.StatusPartialContent, description: "the range asked for", raw: octetStream},
		},
		problems: []int{http.StatusConflict, http.StatusRequestedRangeNotSatisfiable},
	},
	"POST " + groupRoute + "/ack": {
		id: "ack", summary: "Settle messages by receipt (cumulative within a message group)",
		params: groupParams{}, body: settleIn{}, responses: okJSON(settledOut{}),
		problems: []int{http.StatusConflict},
	},
	"POST " + groupRoute + "/nack": {
		id: "nack", summary: "Fail messages by receipt: delivered again after retry_after, dead-lettered after the last attempt",
		params: groupParams{}, body: settleIn{}, responses: okJSON(settledOut{}),
		problems: []int{http.StatusConflict},
	},
	"POST " + groupRoute + "/visibility": {
		id: "changeVisibility", summary: "Change the visibility timeout of received messages (receipts or session ids), as SQS ChangeMessageVisibility",
		params: groupParams{}, body: visibilityIn{}, responses: okJSON(changedOut{}),
		problems: []int{http.StatusConflict},
	},
	"POST " + groupRoute + "/session/close": {
		id: "closeSession", summary: "Close a session: its message group is given back at once",
		params: groupParams{}, body: closeSessionIn{}, responses: okJSON(closedOut{}),
		problems: []int{http.StatusConflict},
	},
	"POST " + groupRoute + "/defer": {
		id: "defer", summary: "Defer received messages (Service Bus Defer): each is settled and set aside, to be received later by its offset",
		params: groupParams{}, body: settleIn{}, responses: okJSON(deferredCountOut{}),
		problems: []int{http.StatusConflict},
	},
	"POST " + groupRoute + "/deferred/receive": {
		id: "receiveDeferred", summary: "Receive deferred messages by their offsets, with receipts (ack, nack, visibility settle them)",
		params: groupParams{}, body: deferredReceiveIn{}, responses: okJSON(deferredMessagesOut{}),
	},
	"GET " + groupRoute + "/deferred": {
		id: "listDeferred", summary: "List the group's deferred messages, in offset order (?after=offset&limit=n)",
		params: struct {
			groupParams
			After int64 `query:"after" minimum:"0" description:"list offsets above this one"`
			Limit int   `query:"limit" minimum:"1" maximum:"10000" description:"1 to 10000 [1000]"`
		}{},
		responses: okJSON(deferredListOut{}),
	},
	"GET " + groupRoute + "/state": {
		id: "getGroupState", summary: "Read the state of a session's message group (an empty body when never set)",
		params:    sessionParams{},
		responses: []apiResponse{{status: http.StatusOK, description: "the state's bytes", raw: octetStream}},
		problems:  []int{http.StatusConflict},
	},
	"PUT " + groupRoute + "/state": {
		id: "setGroupState", summary: "Store the state of a session's message group (at most the largest message's size)",
		params: sessionParams{}, rawBody: octetStream,
		responses: []apiResponse{{status: http.StatusNoContent, description: "stored"}},
		problems:  []int{http.StatusConflict},
	},
	"GET " + tenantRoute + "/topics": {
		id: "topics", summary: "List the tenant's topics",
		params: struct {
			tenantParams
			pageParams
		}{},
		responses: okJSON(listOut[topicOut]{}),
	},
	"GET " + topicRoute + "/offsets": {
		id: "offsets", summary: "Cursors and lag per partition",
		params: struct {
			topicParams
			Group string `query:"group" description:"one consumer group's cursors (default: every group's)"`
			pageParams
		}{},
		responses: okJSON(listOut[offsetOut]{}),
	},
	"GET " + topicRoute + "/groups": {
		id: "groups", summary: "Consumer groups of the topic: members, lag, pause state",
		params: topicParams{}, responses: okJSON(listOut[groupOut]{}),
	},
	"GET " + tenantRoute + "/leases": {
		id: "leases", summary: "Partition leases",
		params: struct {
			tenantParams
			pageParams
		}{},
		responses: okJSON(listOut[leaseOut]{}),
	},
	"GET " + tenantRoute + "/subscribers": {
		id: "subscribers", summary: "Group members (heartbeat rows)",
		params: struct {
			tenantParams
			pageParams
		}{},
		responses: okJSON(listOut[memberOut]{}),
	},
	"GET " + topicRoute + "/dead-letters": {
		id: "deadLetters", summary: "Dead letters of the topic (topic.dlq)",
		params: struct {
			topicParams
			pageParams
		}{},
		responses: okJSON(messagesOut{}),
	},
	"POST " + topicRoute + "/dead-letters/requeue": {
		id: "requeue", summary: "Requeue one dead letter (key, id) or all",
		params: topicParams{}, body: requeueIn{}, responses: okJSON(requeuedOut{}),
		problems: []int{http.StatusNotFound},
	},
	"GET " + tenantRoute + "/half-messages": {
		id: "halfMessages", summary: "Transactional half messages awaiting their outcome",
		params: struct {
			tenantParams
			pageParams
		}{},
		responses: okJSON(listOut[halfOut]{}),
	},
	"GET " + topicRoute + "/messages": {
		id: "browse", summary: "Browse stored messages (no consumer group)",
		params: struct {
			topicParams
			Key   string `query:"key" description:"one partition (\"\" is the ungrouped one)"`
			After int64  `query:"after" minimum:"0" description:"offset"`
			Limit int    `query:"limit" minimum:"1" maximum:"10000"`
		}{},
		responses: okJSON(messagesOut{}),
	},
	"DELETE " + topicRoute + "/messages": {
		id: "deleteMessage", summary: "Delete one message by identity",
		params: struct {
			topicParams
			Key string `query:"key" description:"the message's partition key (empty: ungrouped)"`
			ID  string `query:"id" required:"true"`
		}{},
		responses: okJSON(deletedOut{}),
		problems:  []int{http.StatusNotFound},
	},
	"POST " + groupRoute + "/reset": {
		id: "reset", summary: "Move a group's cursors: a preview unless execute is true",
		params: groupParams{}, body: resetIn{}, responses: okJSON(resetOut{}),
		problems: []int{http.StatusConflict},
	},
	"POST " + groupRoute + "/pause": {
		id: "pause", summary: "Pause the group: members keep their leases and stop delivering",
		params: groupParams{}, body: emptyIn{}, optionalBody: true, responses: okJSON(pausedOut{}),
	},
	"POST " + groupRoute + "/resume": {
		id: "resume", summary: "Resume a paused group",
		params: groupParams{}, body: emptyIn{}, optionalBody: true, responses: okJSON(pausedOut{}),
	},
	"GET " + tenantRoute: {
		id:      "tenant",
		summary: "What the tenant stores: messages and stored bytes per topic (what max_bytes counts), and whether it is suspended (a full count on its shard)",
		params:  tenantParams{}, responses: okJSON(tenantOut{}),
	},
	"POST " + tenantRoute + "/suspend": {
		id:      "suspendTenant",
		summary: "Suspend the tenant: its publishes and receives answer 403 tenant-suspended, its members release its partitions; nothing stored changes",
		params:  tenantParams{}, body: emptyIn{}, optionalBody: true, responses: okJSON(suspendedOut{}),
	},
	"POST " + tenantRoute + "/resume": {
		id: "resumeTenant", summary: "End the tenant's suspension",
		params: tenantParams{}, body: emptyIn{}, optionalBody: true, responses: okJSON(suspendedOut{}),
	},
	"GET " + tenantRoute + "/limits": {
		id: "tenantLimits", summary: "The tenant's quotas and retention",
		params: tenantParams{}, responses: okJSON(limitsJSON{}),
	},
	"PUT " + tenantRoute + "/limits": {
		id: "setTenantLimits",
		summary: "Replace the tenant's quotas and retention (a field left out: 0); an operator's, not the tenant's own admin's. " +
			"A publish over a rate answers 429 with Retry-After, over what is stored 409, each of problem type quota-exceeded naming the quota and its limit",
		params: tenantParams{}, body: limitsJSON{}, responses: okJSON(limitsJSON{}),
	},
	"GET " + tenantRoute + "/export": {
		id: "exportTenant",
		summary: "Stream the tenant's consumer groups, cursors, message-group states and messages as JSON lines (docs/tenants.md); " +
			"an answer without its end line is resumed with ?after= set to the last message line's cursor. A transfer: one of the server's large-transfer slots",
		params: struct {
			tenantParams
			After string `query:"after" description:"the cursor of the last message line of an export cut short"`
			Batch int    `query:"batch" minimum:"1" maximum:"10000" description:"rows read per statement (1 to 10000, default 100)"`
		}{},
		responses: []apiResponse{{status: http.StatusOK, description: "JSON lines", raw: "application/x-ndjson"}},
	},
	"POST " + tenantRoute + "/delete": {
		id: "deleteTenant",
		summary: "Preview (or, with execute, make) the deletion of every row of the tenant, its tokens included; " +
			"refused with 409 while a member is live unless force; sent again, it resumes one cut short",
		params: tenantParams{}, body: deleteTenantIn{}, optionalBody: true, responses: okJSON(deleteTenantOut{}),
		problems: []int{http.StatusConflict},
	},

	// Without a token.
	"GET /healthz": {
		id: "healthz", summary: "The process answers",
		responses: okJSON(healthOut{}),
	},
	"GET /readyz": {
		id: "readyz", summary: "The database answers and is migrated",
		responses: []apiResponse{{status: http.StatusOK, description: "ready", body: readyOut{}}},
		problems:  []int{http.StatusServiceUnavailable},
	},
	"GET /metrics": {
		id: "metrics", summary: "Prometheus metrics (docs/observability.md)",
		responses: []apiResponse{{status: http.StatusOK, description: "text exposition format"}},
	},
	"GET /v1/openapi.json": {
		id: "openapi", summary: "This document",
		responses: []apiResponse{{status: http.StatusOK, description: "OK"}},
	},
}
