package consumer

import (
	"context"
	"reflect"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The consumer reads back a few of the user's Kafka options through
// kgo.Client.OptValue, whose result is an `any`. Its dynamic type is not
// part of franz-go's API: v1.22.2 returned the consumed topics as a
// map[string]*regexp.Regexp, v1.22.3 as the []string its documentation
// names. These readers accept any form built from the value's kind (a
// string, a slice of strings, a map keyed by strings, an integer, a bool)
// and report whether they understood it, so that callers can fall back to
// a safe choice instead of refusing a valid configuration. Each takes
// what OptValue returned: asStrings(cl.OptValue(kgo.ConsumeTopics)).

// asStrings reads a string-list option (kgo.SeedBrokers,
// kgo.ConsumeTopics): a string, a slice or array of strings, or the keys
// of a map keyed by strings, sorted. ok is false for any other form.
func asStrings(opt any) (vals []string, ok bool) {
	v := reflect.ValueOf(opt)
	switch v.Kind() {
	case reflect.String:
		return []string{v.String()}, true
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() != reflect.String {
			return nil, false
		}
		vals = make([]string, v.Len())
		for i := range vals {
			vals[i] = v.Index(i).String()
		}
		return vals, true
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return nil, false
		}
		for _, k := range v.MapKeys() {
			vals = append(vals, k.String())
		}
		slices.Sort(vals)
		return vals, true
	}
	return nil, false
}

// asString reads a string option (kgo.ConsumerGroup,
// kgo.TransactionalID); ok is false when the value is not a string.
func asString(opt any) (s string, ok bool) {
	v := reflect.ValueOf(opt)
	if v.Kind() != reflect.String {
		return "", false
	}
	return v.String(), true
}

// asBool reads a boolean option (kgo.ConsumeRegex); ok is false when the
// value is not a bool.
func asBool(opt any) (b, ok bool) {
	v := reflect.ValueOf(opt)
	if v.Kind() != reflect.Bool {
		return false, false
	}
	return v.Bool(), true
}

// asInt reads an integer option of any width, durations included
// (kgo.FetchMaxPartitionBytes, kgo.RebalanceTimeout); ok is false when the
// value is not an integer.
func asInt(opt any) (n int64, ok bool) {
	v := reflect.ValueOf(opt)
	switch v.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return v.Int(), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if u := v.Uint(); u <= 1<<63-1 {
			return int64(u), true
		}
	}
	return 0, false
}

// onFetchedFn is the signature of kgo.OnOffsetsFetched's callback.
type onFetchedFn = func(context.Context, *kgo.Client, *kmsg.OffsetFetchResponse) error

// asFunc reads a callback option (kgo.OnOffsetsFetched) as F: the function
// as given, or one of another func type with F's signature. An option not
// set (nil, or a nil function) is a nil F with ok true; ok is false for
// any other form, which a caller must not take for "no callback".
func asFunc[F any](opt any) (f F, ok bool) {
	if opt == nil {
		return f, true
	}
	if f, ok := opt.(F); ok {
		return f, true
	}
	v, t := reflect.ValueOf(opt), reflect.TypeFor[F]()
	if t.Kind() != reflect.Func || v.Kind() != reflect.Func || !v.Type().ConvertibleTo(t) {
		return f, false
	}
	return v.Convert(t).Interface().(F), true
}
