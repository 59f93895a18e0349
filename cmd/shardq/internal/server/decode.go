// SPDX-License-Identifier: Apache-2.0

package server

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"

	"github.com/shardq/shardq"
	"github.com/shardq/shardq/internal/ident"
)

// A JSON request body is read whole into one buffer (bounded by
// MaxBodyBytes, charged as it grows), scanned token by token against the bounds below, and
// only then decoded: what a body decodes into is then bounded by its size
// and these counts, whatever it holds (8 MiB of "{}," would otherwise be
// millions of structs). The scan stops at the first token over a bound.
const (
	// maxJSONDepth is the deepest nesting of any request: a publish's
	// {"messages": [{"headers": {...}}]}.
	maxJSONDepth = 4
	// maxJSONElements bounds any array: messages, receipts, ack and
	// offsets are each at most 1,000 a request.
	maxJSONElements = 1000
	// maxJSONMembers bounds any object: a message's headers, or a
	// request's own fields (a name given twice counts twice).
	maxJSONMembers = ident.MaxHeaders
	// What a decoded value may hold besides twice its string's bytes (its
	// share of a struct, a map entry, the message built from it), charged
	// with the body to the server's budget: an object or array (a struct,
	// a map, a slice), a string value, a name (a map's key), a number or
	// literal.
	jsonContainerCost = 256
	jsonStringCost    = 64
	jsonNameCost      = 16
	jsonScalarCost    = 16
)

// jsonOptions decode as encoding/json does (its v1 semantics: names
// matched without regard to case), refusing unknown fields, without
// copying the body first, and refusing a field given twice: the scan
// refused names given twice exactly, this refuses "Messages" after
// "messages", which v1 would let replace it (a map's keys stay distinct
// by case). The scan has refused invalid UTF-8 already.
var jsonOptions = jsonv2.JoinOptions(jsonv1.DefaultOptionsV1(), jsontext.AllowDuplicateNames(false), jsonv2.RejectUnknownMembers(true))

var scanners = sync.Pool{New: func() any { return new(jsontext.Decoder) }}

// decodeJSON decodes exactly one JSON value of body into v, refusing
// unknown fields, trailing data and anything past the bounds above with
// a ValidationError naming the field. An empty body is {}. When body is
// a request's budgetBody, what the decoded form may hold is charged to
// the server's budget before it is decoded.
func decodeJSON(body io.Reader, v any) error {
	data, err := readBody(body)
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	decoded, err := scanJSON(data)
	if err != nil {
		return err
	}
	if b, ok := body.(*budgetBody); ok {
		if err := b.hold(int64(cap(data)) + decoded); err != nil {
			return err
		}
		defer b.hold(decoded) //nolint:errcheck // less than it holds: the buffer is garbage once decoded
	}
	if err := jsonv2.Unmarshal(data, v, jsonOptions); err != nil {
		return &shardq.ValidationError{Field: "body", Rule: "malformed JSON: " + err.Error()}
	}
	return nil
}

// readBody reads body to its end. A budgetBody is charged for the buffer
// as it grows, so that a body holds what has arrived, not what it
// announced.
func readBody(body io.Reader) ([]byte, error) {
	b, _ := body.(*budgetBody)
	data := make([]byte, 0, 512)
	if b != nil {
		if err := b.hold(int64(cap(data))); err != nil {
			return nil, err
		}
	}
	for {
		if len(data) == cap(data) {
			more := cap(data) // doubled
			if b != nil {
				more = int(min(int64(more), b.limit+1-int64(cap(data)))) // the limit's last byte says it is passed
			}
			grown := make([]byte, len(data), cap(data)+max(more, 1)) // exactly: append's growth rounds up
			copy(grown, data)
			if b != nil {
				if err := b.hold(int64(cap(grown))); err != nil {
					return nil, err
				}
			}
			data = grown
		}
		n, err := body.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		var tooBig *http.MaxBytesError
		switch {
		case errors.Is(err, io.EOF):
			return data, nil
		case errors.As(err, &tooBig):
			return nil, errBodyTooLarge{tooBig.Limit}
		case err != nil: // the client went away, or sent a broken chunked body
			return nil, &shardq.ValidationError{Field: "body", Rule: "could not be read: " + err.Error()}
		}
	}
}

// scanJSON checks that data is one JSON value within the bounds, and
// returns what decoding it may hold: its strings' bytes and a cost per
// value.
func scanJSON(data []byte) (int64, error) {
	dec := scanners.Get().(*jsontext.Decoder)
	defer func() { dec.Reset(http.NoBody); scanners.Put(dec) }() // not holding data
	// A name given twice, and bytes that are not UTF-8, are refused: the
	// first would charge for values the decoder drops, the second decode
	// into three bytes a byte (U+FFFD), and neither says anything a client
	// means (RFC 8259: UTF-8; names should be unique).
	dec.Reset(bytes.NewBuffer(data))
	var held int64
	for done := false; ; {
		before := dec.InputOffset()
		tok, err := dec.ReadToken()
		if errors.Is(err, io.EOF) {
			return held, nil
		}
		if err != nil {
			return 0, &shardq.ValidationError{Field: "body", Rule: "malformed JSON: " + err.Error()}
		}
		if done {
			return 0, &shardq.ValidationError{Field: "body", Rule: "one JSON object expected; found more after it"}
		}
		depth := dec.StackDepth()
		done = depth == 0
		switch kind := tok.Kind(); kind {
		case '}', ']':
			continue
		case '"':
			held += 2 * (dec.InputOffset() - before) // the string, and what it is turned into
			if k, n := dec.StackIndex(depth); k == '{' && n%2 == 1 {
				held += jsonNameCost
			} else {
				held += jsonStringCost
			}
		case '{', '[':
			if depth > maxJSONDepth {
				return 0, &shardq.ValidationError{Field: jsonField(dec, depth-1), Rule: fmt.Sprintf("nested more than %d deep", maxJSONDepth)}
			}
			depth-- // the container it opened is counted in its parent
			held += jsonContainerCost
		default:
			held += jsonScalarCost
		}
		if depth == 0 {
			continue
		}
		switch kind, n := dec.StackIndex(depth); kind {
		case '[':
			if n > maxJSONElements {
				return 0, &shardq.ValidationError{Field: jsonField(dec, depth-1), Rule: fmt.Sprintf("more than %d elements, limit %d a request", maxJSONElements, maxJSONElements)}
			}
		case '{':
			if (n+1)/2 > maxJSONMembers {
				return 0, &shardq.ValidationError{Field: jsonField(dec, depth-1), Rule: fmt.Sprintf("more than %d members, limit %d", maxJSONMembers, maxJSONMembers)}
			}
		}
	}
}

// jsonField names the container at depth (1: the body's own value) of
// the value dec read last, as the API's fields are named:
// "messages[3].headers".
func jsonField(dec *jsontext.Decoder, depth int) string {
	var b strings.Builder
	i := 0
	for tok := range dec.StackPointer().Tokens() {
		if i++; i > depth {
			break
		}
		if kind, _ := dec.StackIndex(i); kind == '[' {
			if _, err := strconv.Atoi(tok); err == nil {
				b.WriteString("[" + tok + "]")
				continue
			}
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	if b.Len() == 0 {
		return "body"
	}
	return b.String()
}

type errBodyTooLarge struct{ limit int64 }

func (e errBodyTooLarge) Error() string { return fmt.Sprintf("request body over %d bytes", e.limit) }

// errBusy refuses a body whose decoded form the server's budget has no
// room for now.
var errBusy = errors.New("the server holds as many request bodies as it may; try again")

// decodeError answers a body that could not be decoded.
func (s *Server) decodeError(w http.ResponseWriter, r *http.Request, err error) {
	var big errBodyTooLarge
	var never errNeverFits
	switch {
	case errors.As(err, &big):
		writeProblem(w, problem{Type: typeTooLarge, Status: http.StatusRequestEntityTooLarge, Detail: big.Error()})
	case errors.As(err, &never):
		writeProblem(w, problem{Type: typeTooLarge, Status: http.StatusRequestEntityTooLarge, Detail: never.Error()})
	case errors.Is(err, errBusy):
		w.Header().Set("Retry-After", "1")
		writeProblem(w, problem{Type: typeRate, Status: http.StatusTooManyRequests, Detail: errBusy.Error()})
	default:
		s.fail(w, r, err)
	}
}
