package protocol

import "strconv"

// appendSeconds appends n in decimal, as strconv.AppendInt(dst, n, 10)
// does. A retry hint is a few digits, and strconv writes one above 99
// into a buffer it clears and then copies: 8 % of a refused line's
// instructions with a 3600 s hint, 4 % with a two-digit one
// (BenchmarkFastFailLine, BenchmarkAppendSeconds). Up to four digits, so
// hints up to 2 h 46 min, are written here digit by digit.
func appendSeconds(dst []byte, n int64) []byte {
	if n < 0 || n > 9999 {
		return strconv.AppendInt(dst, n, 10)
	}
	u := uint32(n)
	switch {
	case u < 10:
		return append(dst, byte('0'+u))
	case u < 100:
		return append(dst, byte('0'+u/10), byte('0'+u%10))
	case u < 1000:
		return append(dst, byte('0'+u/100), byte('0'+u/10%10), byte('0'+u%10))
	}
	return append(dst, byte('0'+u/1000), byte('0'+u/100%10), byte('0'+u/10%10), byte('0'+u%10))
}
